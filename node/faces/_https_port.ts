/**
 * The node's client for a sandbox port that serves HTTPS (E2B's `network.httpsPorts`): one TLS
 * connection per request to the sandbox's address, the answer streamed back as a `Response`.
 *
 * The sandbox's certificate is NOT verified: the server is the sandbox's own backend, reached at
 * the address the engine gave it, usually with a self-signed certificate (as in E2B, where
 * "certificates are not verified, so self-signed ones work"). What the client trusts is the
 * fleet's own TLS in front (the gateway's certificate); the hop from node to sandbox is the
 * node's private network, which TLS here only has to speak, not authenticate.
 *
 * `fetch` cannot skip verification per request (only `--unsafely-ignore-certificate-errors`
 * for the whole process), so this is `node:https` with `rejectUnauthorized: false`, and no
 * connection is kept after its answer (no pool to bound or evict).
 *
 * @module
 */
import https from "node:https";
import type { IncomingMessage } from "node:http";
import { Readable } from "node:stream";
import { isIP } from "node:net";

/** What {@linkcode fetchSandboxTls} sends. */
export interface SandboxTlsRequest {
  method: string;
  /** Sent as they are, `host` included when set (the masked Host). */
  headers: Headers;
  /** The request body; `null` for none. */
  body: ReadableStream<Uint8Array> | null;
  /** Aborts the request, and the answer's body once it flows. */
  signal: AbortSignal;
}

/**
 * Sends `init` to `https://<hostname>:<port><path>` without verifying the server's
 * certificate, and resolves once the answer's head has arrived. The TLS name (SNI) is the
 * `host` header's name when it is a name, else none (an address is never sent as SNI).
 *
 * @throws {Error} the connection's or TLS's error, or the signal's reason once it aborts.
 * @example
 * ```ts ignore
 * const res = await fetchSandboxTls("172.17.0.5", 8443, "/", {
 *   method: "GET", headers: new Headers(), body: null, signal: AbortSignal.timeout(30_000),
 * });
 * ```
 */
export function fetchSandboxTls(
  hostname: string,
  port: number,
  path: string,
  init: SandboxTlsRequest,
): Promise<Response> {
  const headers: Record<string, string | string[]> = {};
  init.headers.forEach((value, name) => {
    headers[name] = name === "set-cookie" ? init.headers.getSetCookie() : value;
  });
  const hostName = init.headers.get("host")?.replace(/:\d+$/, "").replace(/^\[|\]$/g, "");
  const servername = hostName && isIP(hostName) === 0 ? hostName : undefined;
  return new Promise<Response>((resolve, reject) => {
    if (init.signal.aborted) return reject(init.signal.reason);
    const req = https.request({
      host: hostname,
      port,
      path,
      method: init.method,
      headers,
      // The sandbox's own backend, typically self-signed: see the module's note.
      rejectUnauthorized: false,
      ...(servername ? { servername } : {}),
      agent: false,
    });
    const onAbort = () => req.destroy(init.signal.reason);
    init.signal.addEventListener("abort", onAbort, { once: true });
    req.on("error", (error) => {
      init.signal.removeEventListener("abort", onAbort);
      reject(init.signal.aborted ? init.signal.reason : error);
    });
    req.on("response", (res: IncomingMessage) => {
      const out = new Headers();
      const raw = res.rawHeaders;
      for (let i = 0; i + 1 < raw.length; i += 2) out.append(raw[i], raw[i + 1]);
      const status = res.statusCode ?? 502;
      const noBody = init.method === "HEAD" || status === 204 || status === 304;
      if (noBody) res.resume();
      // The answer's body ends the request's life: the abort listener goes with it.
      res.on("close", () => init.signal.removeEventListener("abort", onAbort));
      try {
        resolve(
          new Response(noBody ? null : Readable.toWeb(res) as ReadableStream<Uint8Array>, {
            status,
            statusText: res.statusMessage ?? "",
            headers: out,
          }),
        );
      } catch (error) {
        // A status a Response cannot carry (below 200 or above 599).
        res.destroy();
        reject(error);
      }
    });
    if (init.body === null) req.end();
    else {
      Readable.fromWeb(init.body as import("node:stream/web").ReadableStream<Uint8Array>)
        .on("error", (error) => req.destroy(error))
        .pipe(req);
    }
  });
}
