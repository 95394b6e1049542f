import assert from "node:assert/strict";
import { buildCommandOf, parseTemplates } from "./templates.ts";

Deno.test(
  "parseTemplates() defaults to the Debian base, the busybox minimal image and the code " +
    "interpreter under both of its names",
  () => {
    for (const value of [undefined, "", "  "]) {
      assert.deepEqual(
        parseTemplates(value),
        new Map([
          ["base", "dormice-base:latest"],
          ["minimal", "dormice-minimal:latest"],
          ["code-interpreter", "dormice-code-interpreter:latest"],
          ["code-interpreter-v1", "dormice-code-interpreter:latest"],
        ]),
      );
    }
  },
);

Deno.test("buildCommandOf() names the script of each image this project builds, any tag", () => {
  assert.deepEqual(buildCommandOf("dormice-base:latest"), [
    "deploy/images/build-base.sh",
    "dormice-base:latest",
  ]);
  assert.deepEqual(buildCommandOf("dormice-code-interpreter:latest"), [
    "deploy/images/build-code-interpreter.sh",
    "dormice-code-interpreter:latest",
  ]);
  assert.deepEqual(buildCommandOf("dormice-minimal:v2"), [
    "deploy/images/build-minimal.sh",
    "dormice-minimal:v2",
  ]);
  assert.deepEqual(buildCommandOf("dormice-minimal"), [
    "deploy/images/build-minimal.sh",
    "dormice-minimal",
  ]);
  for (const other of ["python:3.12", "registry.local:5000/dormice-base:latest", "base"]) {
    assert.equal(buildCommandOf(other), null, other);
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
