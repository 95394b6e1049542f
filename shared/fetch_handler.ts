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

/**
 * The handler as the library calls it inside, `(input, init) => Promise<Response>`; the global
 * `fetch` is kept as it is (so the options only it knows still reach it), any other handler gets
 * one `Request` built from the input and init.
 *
 * @example
 * ```ts
 * import { asFetch } from "@dormice/cluster/shared";
 * const send = asFetch((request) => new Response(`${request.method} ${request.url}`));
 * console.log(await (await send("http://x.test/a", { method: "POST" })).text()); // POST http://x.test/a
 * ```
 */
export function asFetch(handler: FetchHandler): typeof fetch {
  if (handler === globalThis.fetch) return globalThis.fetch;
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
