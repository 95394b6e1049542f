/**
 * The narrow HTTP client the library's options take: a function from a `Request` to its
 * `Response`. The global `fetch` is one, and so is a Hono app's `request` or any server's
 * `fetch` handler, so a whole fleet runs in process with no sockets.
 *
 * @module
 */

/**
 * Sends one request and answers it: the global `fetch`, `(request) => app.request(request)` of a
 * Hono app, or another in-process handler.
 */
export type FetchHandler = (request: Request) => Response | Promise<Response>;

/** Handlers known to take `(input, init)` as `fetch` does (see {@linkcode markFetchShaped}). */
const fetchShaped = new WeakSet<object>();

/**
 * Says that `fn` takes `(input, init)` as the global `fetch` does, so {@linkcode asFetch} passes it
 * on as it is rather than building a `Request` for it: the gateway's own HTTP/1.1 client to its
 * nodes is one. A built `Request` carries the caller's abort signal only through a signal that
 * follows it, and a hang-up must reach the node's socket at once.
 */
export function markFetchShaped<T extends object>(fn: T): T {
  fetchShaped.add(fn);
  return fn;
}

/**
 * The handler as the library calls it inside, `(input, init) => Promise<Response>`; the global
 * `fetch` is kept as it is (so the options only it knows still reach it), any other handler gets
 * one `Request` built from the input and init.
 *
 * @example
 * ```ts
 * import { asFetch } from "./fetch_handler.ts";
 * const send = asFetch((request) => new Response(`${request.method} ${request.url}`));
 * console.log(await (await send("http://x.test/a", { method: "POST" })).text()); // POST http://x.test/a
 * ```
 */
export function asFetch(handler: FetchHandler): typeof fetch {
  if (handler === globalThis.fetch || fetchShaped.has(handler)) return handler as typeof fetch;
  return ((input: RequestInfo | URL, init?: RequestInit) => {
    try {
      const request = input instanceof Request && init === undefined
        ? input
        : new Request(input, init);
      return Promise.resolve(handler(request));
    } catch (error) {
      return Promise.reject(error);
    }
  }) as typeof fetch;
}
