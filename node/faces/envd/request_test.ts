import assert from "node:assert/strict";
import { resolvePath } from "./request.ts";

Deno.test("resolvePath() starts relative paths at the user's home", () => {
  assert.equal(resolvePath("a.txt", "user", "path"), "/home/user/a.txt");
  assert.equal(resolvePath("~/b/../c", "root", "path"), "/root/c");
  assert.equal(resolvePath("/tmp/x/", "user", "path"), "/tmp/x");
  assert.throws(() => resolvePath("", "user", "path"), /'path' is required/);
});
