import assert from "node:assert/strict";
import { JSON_ITEMS_PER_SLICE, jsonArrayResponse } from "./json_stream.ts";

Deno.test("jsonArrayResponse() writes JSON.stringify's bytes, a slice of items per chunk", async () => {
  const items = Array.from({ length: 1234 }, (_, i) => ({ i, s: `"${i}"\n`, u: undefined }));
  for (const field of [undefined, "sandboxes"]) {
    const res = jsonArrayResponse(items, field);
    assert.equal(res.headers.get("content-type"), "application/json");
    let chunks = 0;
    let text = "";
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) chunks++, text += decoder.decode(chunk, { stream: true });
    assert.equal(text, JSON.stringify(field === undefined ? items : { [field]: items }));
    // The head, three slices, the tail.
    assert.equal(chunks, 2 + Math.ceil(items.length / JSON_ITEMS_PER_SLICE));
  }
  assert.equal(await jsonArrayResponse([]).text(), "[]");
  assert.equal(await jsonArrayResponse([], "a", { status: 200 }).text(), '{"a":[]}');
});
