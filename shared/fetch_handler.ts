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
 * nodes is one, which takes options a `Request` cannot carry and watches the caller's signal
 * itself. (A built `Request`'s signal follows the caller's: an abort reaches an embedder's handler
 * too, in process and through a real connection, as `examples/embedder/abort_test.ts` shows.)
 */
export function markFetchShaped<T extends object>(fn: T): T {
  fetchShaped.add(fn);
  return fn;
}

/**
 * The handler as the library calls it inside, `(input, init) => Promise<Response>`; the global
 * `fetch` is kept as it is (so the options only it knows still reach it), any other handler gets
 * one `Request` built from the input and init. As `fetch` does, the call rejects with the signal's
 * reason once the signal aborts before the handler has answered (at once when it already has): an
 * in-process handler that does not watch its `Request`'s signal (a node parked on a slow executor
 * call) must not keep the library's caller, and the name slot or request it holds, waiting after
 * the client has gone. The handler's `Request` aborts too, so it can stop its own work.
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
    let request: Request;
    try {
      request = input instanceof Request && init === undefined ? input : new Request(input, init);
    } catch (error) {
      return Promise.reject(error);
    }
    const signal = request.signal;
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<Response>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      const settle = () => signal.removeEventListener("abort", onAbort);
      try {
        Promise.resolve(handler(request)).then(
          (response) => {
            settle();
            resolve(response);
          },
          (error) => {
            settle();
            reject(error);
          },
        );
      } catch (error) {
        settle();
        reject(error);
      }
    });
  }) as typeof fetch;
}
