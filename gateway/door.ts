/**
 * The gateway's door: what every request meets before any face routes it.
 *
 * - **Loops.** Every request the gateway sends (lookups, forwards, creates, listings) carries
 *   the hop marker {@linkcode HOP_HEADER} naming this gateway instance (a random id per
 *   gateway). A request arriving with its own id came back through a node endpoint that leads to
 *   the gateway itself (a rogue or mistyped check-in): it is refused with a 508, so a fan-out
 *   does not call itself until the process dies. A check-in naming the gateway's own listening
 *   address is refused earlier still ({@linkcode isOwnAddress}).
 * - **Dot segments.** A raw path with a `.` or `..` segment (also percent-encoded) or a
 *   backslash is a 400. Hono routes on the raw path while `new URL()` (which the faces use to
 *   build the node's path) removes dot segments, so `/e2b/envd/../x` was routed to envd and
 *   forwarded as `/e2b/envd/e2b/x`. Refusing is simpler than normalising once for every reader
 *   of the path (the auth gate, the fast path, Hono, the faces), and no client of ours sends them:
 *   the SDKs build fixed paths and carry file paths in the query.
 *
 * Each refusal answers in the dialect of the face the raw path names: native `{message}`,
 * E2B `{code:<int>, message}`, Connect `{code:"<string>", message}` on envd's RPC paths.
 *
 * @module
 */
import { sentUrl } from "../shared/http1/mod.ts";
import { statusToConnectCode } from "../shared/connect_codes.ts";

/** The hop marker: the comma-separated ids of the gateways a request went through. */
export const HOP_HEADER: string = "x-dormice-hop";

/**
 * A fresh gateway instance id for the hop marker: random, so two gateways (or two processes of
 * one) never share one.
 *
 * @example
 * ```ts
 * import { newGatewayInstanceId } from "./door.ts";
 * newGatewayInstanceId(); // e.g. "gw-3f0c…"
 * ```
 */
export function newGatewayInstanceId(): string {
  return `gw-${crypto.randomUUID()}`;
}

/**
 * The marker to send onward: the one the request came with (if any), then `instanceId`. A
 * forward keeps the ids before it, so a loop through several gateways is caught too.
 *
 * @example
 * ```ts
 * import { nextHop } from "./door.ts";
 * nextHop(null, "gw-a"); // "gw-a"
 * nextHop("gw-b", "gw-a"); // "gw-b, gw-a"
 * ```
 */
export function nextHop(incoming: string | null, instanceId: string): string {
  // Bounded: a marker that grew past a few ids is a loop the next gateway will refuse anyway.
  return incoming ? `${incoming.slice(0, 1000)}, ${instanceId}` : instanceId;
}

/**
 * Whether a hop marker names `instanceId`.
 *
 * @example
 * ```ts
 * import { markerNames } from "./door.ts";
 * markerNames("gw-b, gw-a", "gw-a"); // true
 * ```
 */
export function markerNames(marker: string | null, instanceId: string): boolean {
  if (marker === null || !marker.includes(instanceId)) return false;
  return marker.split(",").some((id) => id.trim() === instanceId);
}

/** Where a gateway listens, for {@linkcode isOwnAddress}. */
export interface ListenAddress {
  /** The host it binds, e.g. `127.0.0.1` or `0.0.0.0` (every interface). */
  hostname: string;
  /** The port it binds (0 means "any": nothing can be told from it). */
  port: number;
}

const wildcardHosts = new Set(["0.0.0.0", "::", "[::]", ""]);

function isLoopbackHost(host: string): boolean {
  return host === "localhost" || host === "::1" || host === "[::1]" ||
    /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * Whether `endpoint` (an origin) names the gateway listening at `listen`, as far as the gateway
 * can tell without asking the network: the same port, and the same host, `localhost` for a
 * loopback bind, or any loopback host for a bind on every interface. An address it cannot tell
 * (another interface of this machine, a DNS name for it) is left to the hop marker.
 *
 * @example
 * ```ts
 * import { isOwnAddress } from "./door.ts";
 * isOwnAddress("http://localhost:3677", { hostname: "127.0.0.1", port: 3677 }); // true
 * isOwnAddress("http://10.0.0.5:3676", { hostname: "127.0.0.1", port: 3677 }); // false
 * ```
 */
export function isOwnAddress(endpoint: string, listen: ListenAddress): boolean {
  if (listen.port === 0) return false;
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    return false;
  }
  const port = url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
  if (port !== listen.port) return false;
  const host = url.hostname.toLowerCase();
  const bound = listen.hostname.toLowerCase();
  if (wildcardHosts.has(bound)) return isLoopbackHost(host);
  if (host === bound || host === `[${bound}]`) return true;
  // A loopback bind answers `localhost` too; another loopback address reaches another socket.
  return host === "localhost" && isLoopbackHost(bound);
}

/** The raw path of an absolute request URL, without its query (no `new URL()`: it normalises). */
function rawPath(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return query === -1 ? url.slice(start) : url.slice(start, query);
}

function isDotSegment(segment: string): boolean {
  if (segment === "." || segment === "..") return true;
  if (segment.length < 3 || segment.length > 6) return false;
  const s = segment.toLowerCase();
  return s === "%2e" || s === "%2e%2e" || s === ".%2e" || s === "%2e.";
}

/**
 * Why a raw path cannot be routed as sent, or `undefined` when it can: a `.` or `..` segment
 * (percent-encoded too) or a backslash, which URL parsing would rewrite after routing.
 *
 * @example
 * ```ts
 * import { pathRefusal } from "./door.ts";
 * pathRefusal("http://gw/e2b/envd/../x"); // a sentence
 * pathRefusal("http://gw/e2b/envd/files?path=/a/../b"); // undefined: the query is the file path
 * ```
 */
export function pathRefusal(url: string): string | undefined {
  const path = rawPath(url);
  const suspicious = path.includes("/.") || path.includes("\\") ||
    (path.includes("%2") && /%2e/i.test(path));
  if (!suspicious) return undefined;
  if (!path.includes("\\") && !path.split("/").some(isDotSegment)) return undefined;
  const shown = path.length > 80 ? `${path.slice(0, 80)}…` : path;
  return `The path '${shown}' has a '.' or '..' segment or a backslash: the gateway routes ` +
    "and forwards a path exactly as sent, so send it without them (a file's path goes in the " +
    "query, e.g. /files?path=/a/../b)";
}

type Dialect = "native" | "e2b" | "connect";

function dialectOf(path: string): Dialect {
  if (path.startsWith("/e2b/envd/")) {
    const rest = path.slice("/e2b/envd".length);
    return rest.startsWith("/files") || rest.startsWith("/health") ? "e2b" : "connect";
  }
  if (path.startsWith("/e2b/") || path === "/files" || path.startsWith("/files/")) return "e2b";
  return "native";
}

function refusal(status: number, message: string, path: string): Response {
  const dialect = dialectOf(path);
  const body = dialect === "native"
    ? { message }
    : { code: dialect === "connect" ? statusToConnectCode(status) : status, message };
  return Response.json(body, { status });
}

/**
 * The door's answer to `request`, or `undefined` to let the faces route it: a 508 when the
 * request carries this gateway's own hop marker, a 400 for a path with dot segments. One header
 * read and one scan of the path in the common case.
 *
 * @example
 * ```ts
 * import { doorAnswer, HOP_HEADER } from "./door.ts";
 * const looped = new Request("http://gw/lookupSandbox", { headers: { [HOP_HEADER]: "gw-a" } });
 * doorAnswer(looped, "gw-a")?.status; // 508
 * ```
 */
export function doorAnswer(request: Request, instanceId: string): Response | undefined {
  const url = sentUrl(request);
  if (markerNames(request.headers.get(HOP_HEADER), instanceId)) {
    return refusal(
      508,
      `This request came back to the gateway that sent it (its ${HOP_HEADER} names this ` +
        `gateway, ${instanceId}): a node's endpoint leads back here. Find the node in listNodes ` +
        "whose endpoint is this gateway's address, correct its DORMICE_NODE_ENDPOINT, and " +
        "remove it with removeNode once it is down",
      rawPath(url),
    );
  }
  const refused = pathRefusal(url);
  return refused === undefined ? undefined : refusal(400, refused, rawPath(url));
}
