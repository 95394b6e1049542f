/**
 * The sandbox domain (`DORMICE_SANDBOX_DOMAIN`): the gateway answers by Host as E2B's own edge
 * does. `api.<domain>` is the E2B control plane at the root paths the SDK calls;
 * `49983-<id>.<domain>` is that sandbox's envd at root paths (signed `/files` URLs included:
 * the host names the sandbox); `<port>-<id>.<domain>` is that port inside that sandbox. Any
 * other host is served as before, so `/e2b/api` and `/e2b/envd` keep working everywhere.
 *
 * @module
 */

/** envd's port: `49983-<id>.<domain>` is envd, any other port a sandbox server. */
export const ENVD_PORT = 49983;

/** What a Host names under the sandbox domain. */
export type HostRoute =
  | { kind: "api" }
  | { kind: "sandbox"; sandboxId: string; port: number }
  | { kind: "badPort"; label: string; reason: string };

/**
 * Reads a Host header against the domain (both compared without their port and case). Returns
 * `undefined` for a host outside the domain, or one whose left-most label has no `-` (nor is
 * `api`). A single label with a `-` names a sandbox port: when what precedes the first `-` is not a
 * port (1 to 65535, decimal, no leading zero) or nothing follows it, the answer is `badPort`, so
 * the caller answers 400 rather than serving a mistyped host as the native API (`08000-` is
 * refused, not read as 8000: one port must have one host name). Ids are lowercase letters and
 * digits; ledgers of earlier versions hold `sbx_…`
 * ids, still routed here for the clients whose certificate check lets them through (Deno's and
 * Node's; OpenSSL's refuses a `_` under a wildcard).
 *
 * @example
 * ```ts
 * import { routeByHost } from "./sandbox_domain.ts";
 * routeByHost("8000-k3v9q0z8m2c4x7w1b5n6.sbx.example.com", "sbx.example.com");
 * // { kind: "sandbox", sandboxId: "k3v9q0z8m2c4x7w1b5n6", port: 8000 }
 * routeByHost("api.sbx.example.com:443", "sbx.example.com"); // { kind: "api" }
 * ```
 */
export function routeByHost(host: string | null, domain: string): HostRoute | undefined {
  if (host === null) return undefined;
  const name = stripPort(host).toLowerCase();
  const suffix = `.${stripPort(domain).toLowerCase()}`;
  if (!name.endsWith(suffix)) return undefined;
  const label = name.slice(0, -suffix.length);
  if (label === "api") return { kind: "api" };
  const dash = label.indexOf("-");
  if (dash < 0 || label.includes(".")) return undefined;
  const portText = label.slice(0, dash);
  const id = label.slice(dash + 1);
  const bad = (reason: string): HostRoute => ({
    kind: "badPort",
    label: label.slice(0, 80),
    reason,
  });
  if (!/^[1-9]\d{0,4}$/.test(portText) || Number(portText) > 65535) {
    const shown = portText.slice(0, 20);
    return bad(
      /^0\d+$/.test(portText) && Number(portText) <= 65535 && Number(portText) > 0
        ? `'${shown}' has a leading zero: write the port as ${Number(portText)}`
        : `'${shown}' is not a port: use a number from 1 to 65535`,
    );
  }
  if (!/^[a-z0-9_-]{1,128}$/.test(id)) {
    return bad(
      id === ""
        ? "no sandbox id follows the port"
        : `'${id.slice(0, 40)}' is not a sandbox id: ids are lowercase letters and digits`,
    );
  }
  return { kind: "sandbox", sandboxId: id, port: Number(portText) };
}

function stripPort(host: string): string {
  // An IPv6 literal keeps its colons inside brackets.
  const end = host.startsWith("[") ? host.indexOf("]") + 1 : host.indexOf(":");
  return end <= 0 ? host : host.slice(0, end);
}

/**
 * Paths of the gateway's own that `api.<domain>` keeps at the root: health, metrics, the fleet
 * page, the `/e2b/` faces, and the native verbs (one camel-case segment; E2B's routes are lower
 * case).
 */
function ownPath(path: string): boolean {
  return path === "/healthz" || path === "/metrics" || path === "/ui" ||
    path.startsWith("/ui/") || path.startsWith("/e2b/") || /^\/[a-z]+[A-Z][A-Za-z]*$/.test(path);
}

/** Options of {@linkcode createDomainFront}. */
export interface DomainFrontOptions {
  /** The sandbox domain, e.g. `sbx.example.com` (a `:port` is allowed and ignored here). */
  domain: string;
  /** The gateway as it serves any other host. */
  next: (request: Request) => Promise<Response>;
  /**
   * Serves a sandbox port other than envd's, `rest` being the path and query there (handed the
   * server's own request, so a WebSocket may upgrade).
   */
  port: (request: Request, sandboxId: string, port: number, rest: string) => Promise<Response>;
}

/**
 * Wraps the gateway's fetch with routing by Host (see the module doc). The control plane and
 * envd are served by the same faces as `/e2b/api` and `/e2b/envd`: the request is re-addressed
 * there (and, for envd, `E2b-Sandbox-Id` set from the host, replacing any the client sent).
 *
 * @example
 * ```ts
 * import { createDomainFront } from "./sandbox_domain.ts";
 * const fetch = createDomainFront({
 *   domain: "sbx.example.com",
 *   next: (r) => Promise.resolve(new Response(new URL(r.url).pathname)),
 *   port: () => Promise.resolve(new Response("port")),
 * });
 * const res = await fetch(new Request("http://api.sbx.example.com/v2/sandboxes"));
 * console.log(await res.text()); // "/e2b/api/v2/sandboxes"
 * ```
 */
export function createDomainFront(
  options: DomainFrontOptions,
): (request: Request) => Promise<Response> {
  const { domain, next, port } = options;
  return (request) => {
    const route = routeByHost(request.headers.get("host") ?? hostOf(request.url), domain);
    if (route === undefined) return next(request);
    if (route.kind === "badPort") {
      // In the shape of E2B's proxy, as the port hop's other errors.
      const message = `The host '${route.label}.${stripPort(domain)}' names no sandbox port: ` +
        `${route.reason}; a sandbox port's host is <port>-<sandboxId>.${stripPort(domain)}`;
      return Promise.resolve(Response.json({ message, code: 400 }, { status: 400 }));
    }
    const url = new URL(request.url);
    if (route.kind === "sandbox" && route.port !== ENVD_PORT) {
      return port(request, route.sandboxId, route.port, url.pathname + url.search);
    }
    if (route.kind === "api") {
      if (ownPath(url.pathname)) return next(request);
      return next(readdress(request, url, `/e2b/api${url.pathname}`));
    }
    const headers = new Headers(request.headers);
    headers.set("e2b-sandbox-id", route.sandboxId);
    headers.set("e2b-sandbox-port", String(ENVD_PORT));
    return next(readdress(request, url, `/e2b/envd${url.pathname}`, headers));
  };
}

function hostOf(url: string): string | null {
  try {
    return new URL(url).host;
  } catch {
    return null;
  }
}

function readdress(request: Request, url: URL, path: string, headers?: Headers): Request {
  const target = new URL(path + url.search, url);
  const hasBody = request.method !== "GET" && request.method !== "HEAD";
  return new Request(target, {
    method: request.method,
    headers: headers ?? request.headers,
    body: hasBody ? request.body : null,
    signal: request.signal,
    redirect: "manual",
    ...(hasBody && request.body ? { duplex: "half" } : {}),
  } as RequestInit);
}
