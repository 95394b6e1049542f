/**
 * A JSON answer holding a long array, stringified a slice of items at a time as the client
 * takes it, so a listing of thousands of rows does not hold the event loop for one long
 * `JSON.stringify` (20,000 sandboxes: 60–130 ms, measured 2026-12-07).
 *
 * @module
 */

/** Items stringified at once by {@linkcode jsonArrayResponse}. */
export const JSON_ITEMS_PER_SLICE = 500;

/**
 * A 200 `application/json` answer: `items` as a JSON array, inside `{"<field>": […]}` when
 * `field` is given. The same bytes as `JSON.stringify` of the same value.
 *
 * @example
 * ```ts
 * import { jsonArrayResponse } from "./json_stream.ts";
 * await jsonArrayResponse([1, 2], "n").text(); // '{"n":[1,2]}'
 * ```
 */
export function jsonArrayResponse(
  items: readonly unknown[],
  field?: string,
  init: ResponseInit = {},
): Response {
  const encoder = new TextEncoder();
  let at = 0;
  let started = false;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (!started) {
        started = true;
        controller.enqueue(
          encoder.encode(field === undefined ? "[" : `{${JSON.stringify(field)}:[`),
        );
        return;
      }
      if (at >= items.length) {
        controller.enqueue(encoder.encode(field === undefined ? "]" : "]}"));
        controller.close();
        return;
      }
      const slice = items.slice(at, at + JSON_ITEMS_PER_SLICE);
      const text = slice.map((item) => JSON.stringify(item) ?? "null").join(",");
      controller.enqueue(encoder.encode((at > 0 ? "," : "") + text));
      at += slice.length;
    },
  }, { highWaterMark: 0 });
  const headers = new Headers(init.headers);
  headers.set("content-type", "application/json");
  return new Response(body, { ...init, headers });
}
