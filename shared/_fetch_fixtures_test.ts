/**
 * A fake fetch's arguments as `(url, init)` with a string body, whether the library called it
 * with a URL and init or with one `Request` (as it calls a `FetchHandler`).
 */
export async function plainArgs(
  input: RequestInfo | URL,
  init?: RequestInit,
): Promise<{ url: string; init: RequestInit }> {
  if (!(input instanceof Request)) return { url: String(input), init: init ?? {} };
  const request = init === undefined ? input : new Request(input, init);
  const body = request.body === null ? undefined : await request.text();
  return {
    url: request.url,
    init: { method: request.method, headers: request.headers, body, signal: request.signal },
  };
}
