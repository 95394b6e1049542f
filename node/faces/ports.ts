/**
 * The node's door to sandbox ports: `ANY /e2b/ports/<port>/<path>` with `E2b-Sandbox-Id` reaches
 * `<path>` on that port inside that sandbox (the gateway sends here what it got by Host
 * `<port>-<id>.<domain>` or by `E2b-Sandbox-Port`). Bodies stream both ways, WebSockets are
 * relayed, and errors take the shape of E2B's own proxy: `{message, sandboxId, code:502}`.
 *
 * Like envd it takes no fleet token: a sandbox's ports are public, as in E2B, unless the sandbox
 * was created with `network.allowPublicTraffic: false` (native: `spec.privatePorts`), and then
 * `e2b-traffic-access-token` must carry its traffic token. `secure` guards envd, not ports.
 *
 * A port the sandbox listed in `network.httpsPorts` (native `spec.httpsPorts`) is reached over
 * TLS without verifying the sandbox's certificate (`_https_port.ts` says why); the public side
 * is the fleet's, https or not as the gateway serves it. WebSockets to such a port are not
 * relayed (a 501 saying so).
 *
 * A sandbox created with `network.maskRequestHost` has its servers see that Host (`${PORT}`
 * replaced by the port), on plain requests and WebSocket handshakes alike, as E2B's proxy does;
 * both go out on clients of our own (`createH1Client({ hostFromHeaders: true })`,
 * `connectWebSocket`), since `fetch` and Deno's `WebSocket` send the address they connect to.
 *
 * @module
 */
import type { Executor } from "../executors/contract.ts";
import { ExecutorError } from "../executors/contract.ts";
import type { SandboxOps, SandboxRecord } from "../service_contract.ts";
import type { AccessTokens } from "../../shared/access_tokens.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { createH1Client, type H1Client } from "../../shared/http1/mod.ts";
import { maskedHost } from "./e2b_create_options.ts";
import { fetchSandboxTls } from "./_https_port.ts";
import {
  endToEndHeaders,
  isWebSocketUpgrade,
  RelayOpenError,
  relayWebSocket,
} from "../../shared/port_proxy.ts";

/** The header a secure sandbox's ports require (E2B's name). */
export const TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token";
/** The path the node serves sandbox ports under. */
export const PORTS_PATH = "/e2b/ports";

/** Options of {@linkcode createPortsDoor}. */
export interface PortsDoorOptions {
  /** Derives each sandbox's traffic token. */
  accessTokens: AccessTokens;
  /** Where unexpected failures are logged. */
  log?: Log;
  /**
   * Bound of the connection to the sandbox's port and of its answer's head: 30 s, long enough
   * for a server that answers slowly, short enough that a dead one frees its caller.
   */
  headTimeoutMs?: number;
  /**
   * The client of requests whose Host is masked (`network.maskRequestHost`): it must send the
   * `host` header it is given. `createNodeApp` passes one and closes it; without it the door
   * makes its own on first use, whose idle connections close after 4 s.
   */
  hostClient?: H1Client;
}

/**
 * Builds the ports door; `createNodeApp` answers `/e2b/ports/*` with it. A paused sandbox is
 * resumed by the request when its lifecycle allows (`autoResume`, or a native sandbox), as envd
 * does; otherwise it is a 502 saying it is paused.
 *
 * @example
 * ```ts
 * import { FakeExecutor, Ledger, SandboxService } from "@dormice/cluster/node";
 * import { AccessTokens } from "../../shared/access_tokens.ts";
 * import { createPortsDoor } from "./ports.ts";
 * const executor = new FakeExecutor();
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:3676" }),
 *   executor,
 * });
 * const door = createPortsDoor(ops, executor, { accessTokens: new AccessTokens("s".repeat(32)) });
 * const res = await door(new Request("http://n/e2b/ports/8000/", { headers: { "e2b-sandbox-id": "x" } }));
 * console.log(res.status); // 502: no such sandbox
 * await res.body?.cancel();
 * await executor.close();
 * ```
 */
export function createPortsDoor(
  ops: SandboxOps,
  executor: Executor,
  options: PortsDoorOptions,
): (request: Request) => Promise<Response> {
  const log = options.log ?? silentLog;
  const headTimeoutMs = options.headTimeoutMs ?? 30_000;
  let hostClient = options.hostClient;
  return async (request) => {
    const url = new URL(request.url);
    const m = /^\/e2b\/ports\/(\d{1,5})(\/.*)?$/.exec(url.pathname);
    const id = request.headers.get("e2b-sandbox-id") ?? "";
    if (!m || Number(m[1]) < 1 || Number(m[1]) > 65535) {
      return answer(400, "The path must be /e2b/ports/<port 1-65535>/<path>", id);
    }
    const port = Number(m[1]);
    if (id === "") {
      return answer(400, "The E2b-Sandbox-Id header is missing: name the sandbox", id);
    }
    const sandbox = ops.get({ id });
    if (sandbox === undefined) return answer(502, "The sandbox was not found", id);
    if (portsArePrivate(sandbox)) {
      const given = request.headers.get(TRAFFIC_TOKEN_HEADER);
      if (!options.accessTokens.verifyTraffic(id, given)) {
        return answer(
          403,
          given
            ? `The ${TRAFFIC_TOKEN_HEADER} header does not match sandbox '${id}': send the ` +
              "trafficAccessToken of its create answer"
            : `Sandbox '${id}' is not open to public traffic: its ports require the ` +
              `${TRAFFIC_TOKEN_HEADER} header ` +
              "with the trafficAccessToken of its create answer",
          id,
        );
      }
    }
    if (sandbox.state !== "active") {
      // As on envd: traffic resumes a sandbox created with autoResume (or a native one).
      const awake = await ops.wakeForTraffic({ id }).catch((error) => {
        log("warn", "a paused sandbox could not be woken for port traffic", {
          sandboxId: id,
          port,
          error: String(error),
        });
        return null;
      });
      if (awake === null) {
        return answer(
          502,
          `The sandbox is ${
            sandbox.state === "frozen"
              ? "paused"
              : sandbox.state === "archived"
              ? "paused to disk"
              : sandbox.state
          }: resume it ` +
            "with Sandbox.connect(), or create it with lifecycle.autoResume so that traffic " +
            "resumes it",
          id,
          { port },
        );
      }
    }
    let address;
    try {
      address = await executor.portAddress(id, port);
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "gone") {
        return answer(502, "The sandbox was not found", id);
      }
      log("warn", "a sandbox port address lookup failed", {
        sandboxId: id,
        port,
        error: String(error),
      });
      return answer(502, `The sandbox's address could not be read: ${String(error)}`, id, { port });
    }
    if (address === null) return closedPort(request, id, port);
    const rest = (m[2] ?? "/") + url.search;
    const headers = endToEndHeaders(request.headers, {}, [
      "e2b-sandbox-id",
      "e2b-sandbox-port",
      TRAFFIC_TOKEN_HEADER,
    ]);
    const target = `${address.hostname}:${address.port}${rest}`;
    const mask = sandbox.e2b.maskRequestHost;
    const host = mask === undefined ? undefined : maskedHost(mask, port);
    const tls = sandbox.spec.httpsPorts?.includes(port) === true;
    if (isWebSocketUpgrade(request) && tls) {
      return answer(
        501,
        `Port ${port} is listed in network.httpsPorts, and WebSockets to an HTTPS port in the ` +
          "sandbox are not relayed: serve the WebSocket on a plain HTTP port (the public URL " +
          "is HTTPS either way)",
        id,
        { port },
      );
    }
    if (isWebSocketUpgrade(request)) {
      try {
        return await relayWebSocket(request, `ws://${target}`, { headers, host });
      } catch (error) {
        if (error instanceof RelayOpenError) return closedPort(request, id, port, error.message);
        if (isNetDenied(error)) return netDenied(id, port, address.hostname);
        throw error;
      }
    }
    const hasBody = request.method !== "GET" && request.method !== "HEAD";
    const connect = AbortSignal.timeout(headTimeoutMs);
    const controller = new AbortController();
    const onTimeout = () => controller.abort(connect.reason);
    connect.addEventListener("abort", onTimeout, { once: true });
    request.signal.addEventListener("abort", () => controller.abort(), { once: true });
    let send: typeof fetch = fetch;
    if (tls) {
      if (host !== undefined) headers.set("host", host);
      send = (_url, init) =>
        fetchSandboxTls(address.hostname, address.port, rest, {
          method: request.method,
          headers,
          body: hasBody ? request.body : null,
          signal: (init as RequestInit).signal!,
        });
    } else if (host !== undefined) {
      headers.set("host", host);
      hostClient ??= createH1Client({ hostFromHeaders: true });
      send = hostClient.fetch;
    }
    let upstream: Response;
    try {
      upstream = await send(`${tls ? "https" : "http"}://${target}`, {
        method: request.method,
        headers,
        body: hasBody ? request.body : null,
        redirect: "manual",
        signal: controller.signal,
        ...(hasBody && request.body ? { duplex: "half" } : {}),
      } as RequestInit);
    } catch (error) {
      if (request.signal.aborted) return new Response(null, { status: 499 });
      if (connect.aborted) {
        return answer(504, `Port ${port} did not answer within ${headTimeoutMs} ms`, id, { port });
      }
      if (isNetDenied(error)) return netDenied(id, port, address.hostname);
      const cause = String((error as Error)?.message ?? error);
      if (tls && !/ECONNREFUSED|refused/i.test(cause)) {
        return answer(
          502,
          `Port ${port} is listed in network.httpsPorts, but TLS with its server failed: ` +
            "check that it serves HTTPS there, or leave the port out of httpsPorts",
          id,
          { port, cause: cause.slice(0, 200) },
        );
      }
      return closedPort(request, id, port, cause);
    } finally {
      // Only the head is bounded: a long answer (an event stream) may flow for as long as it likes.
      connect.removeEventListener("abort", onTimeout);
    }
    return new Response(upstream.body, {
      status: upstream.status,
      statusText: upstream.statusText,
      headers: endToEndHeaders(upstream.headers),
    });
  };
}

/**
 * Whether a sandbox's ports require its traffic token: the native `spec.privatePorts`, or an
 * E2B create with `network.allowPublicTraffic: false`. Not `secure`: in E2B it guards envd (the
 * access token), and the SDKs send it by default (JS up to 2.45, Python 2.34), so reading it as
 * "private ports" would lock most sandboxes' `getHost(port)` behind a token their users never
 * asked for.
 *
 * @example
 * ```ts
 * import { portsArePrivate } from "./ports.ts";
 * portsArePrivate({ spec: {}, e2b: { secure: true } }); // false
 * portsArePrivate({ spec: {}, e2b: { allowPublicTraffic: false } }); // true
 * ```
 */
export function portsArePrivate(
  s: Pick<SandboxRecord, "spec"> & { e2b?: { secure?: boolean; allowPublicTraffic?: boolean } },
): boolean {
  return s.spec.privatePorts === true || s.e2b?.allowPublicTraffic === false;
}

/**
 * Deno refused the connection itself: the node runs with an `--allow-net` list. Our HTTP/1.1
 * client wraps the refusal as the cause of its TypeError.
 */
function isNetDenied(error: unknown): boolean {
  const denied = (e: unknown) =>
    e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied;
  return denied(error) || denied((error as { cause?: unknown } | null)?.cause);
}

function netDenied(id: string, port: number, hostname: string): Response {
  return answer(
    502,
    `The node may not connect to the sandbox at ${hostname}: its --allow-net list does not ` +
      "name that address; run the node with --allow-net (as deno task node does), since the " +
      "engine picks sandbox addresses",
    id,
    { port },
  );
}

/** E2B's proxy's answer to a browser: a page, where every other client gets JSON. */
const BROWSER = /mozilla|chrome|safari|firefox|opera|msie|edg\//i;

/**
 * A running sandbox's port that nothing listens on: E2B's proxy's 502, word for word (clients
 * match `message`; the SDKs' own tests and their RPC error mapping do), with what to do in `hint`;
 * a browser gets an HTML page titled "Closed Port Error", as from E2B.
 */
function closedPort(request: Request, id: string, port: number, cause?: string): Response {
  const hint = `start a server on 0.0.0.0:${port} inside the sandbox`;
  if (BROWSER.test(request.headers.get("user-agent") ?? "")) {
    const page = `<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Closed Port Error</title></head>
<body>
<h1>Closed Port Error</h1>
<p>The sandbox <code>${escapeHtml(id)}</code> is running but port ${port} is not open: ${hint}.</p>
</body>
</html>
`;
    return new Response(page, {
      status: 502,
      headers: { "content-type": "text/html; charset=utf-8" },
    });
  }
  return answer(502, "The sandbox is running but port is not open", id, {
    port,
    hint,
    ...(cause ? { cause: cause.slice(0, 200) } : {}),
  });
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** E2B's proxy error shape: `{message, sandboxId, code}` with the status as `code`. */
function answer(
  status: number,
  message: string,
  sandboxId: string,
  extra: Record<string, unknown> = {},
): Response {
  return Response.json({ message, sandboxId, ...extra, code: status }, { status });
}
