import assert from "node:assert/strict";
import { parseTemplates } from "./templates.ts";

Deno.test("parseTemplates() defaults to the base image when unset or empty", () => {
  for (const value of [undefined, "", "  "]) {
    assert.deepEqual(parseTemplates(value), new Map([["base", "dormice-base:latest"]]));
  }
});

Deno.test("parseTemplates() reads name=image pairs", () => {
  assert.deepEqual(
    parseTemplates(" base=dormice-base:latest , python=registry.local:5000/py:3.12 "),
    new Map([["base", "dormice-base:latest"], ["python", "registry.local:5000/py:3.12"]]),
  );
});

Deno.test("parseTemplates() answers a sentence for each kind of mistake", () => {
  const cases: [string, RegExp][] = [
    ["python=py:3", /no 'base' template/],
    ["base", /not name=image/],
    ["base=", /not name=image/],
    ["base=a,base=b", /names template 'base' twice/],
    ["base=a,Py=b", /template name is 1-64 lowercase/],
    ["base=a b", /has a space/],
  ];
  for (const [value, pattern] of cases) {
    const result = parseTemplates(value);
    assert.equal(typeof result, "string", value);
    assert.match(result as string, pattern);
    assert.match(result as string, /^DORMICE_TEMPLATES=/);
  }
});
