import assert from "node:assert/strict";
import { hideNodePaths, splitVolumePath } from "./volume_paths.ts";

Deno.test("splitVolumePath: a name over 255 bytes is a 400 naming the limit", () => {
  assert.deepEqual(splitVolumePath("a/" + "n".repeat(255)), ["a", "n".repeat(255)]);
  assert.throws(() => splitVolumePath("a/" + "n".repeat(256)), /over 255 bytes/);
  // Bytes, not characters: 128 two-byte letters are 256 bytes.
  assert.throws(() => splitVolumePath("é".repeat(128)), /over 255 bytes/);
});

Deno.test("hideNodePaths: a volume's paths show as the tenant's, the node's as <volume root>", () => {
  const root = "/srv/dormice/volumes";
  const id = "vol-0123456789abcdef0123";
  assert.equal(
    hideNodePaths(
      `No such file or directory (os error 2): lstat '${root}/${id}/data/notes/a'`,
      root,
    ),
    "No such file or directory (os error 2): lstat '/notes/a'",
  );
  assert.equal(hideNodePaths(`denied: '${root}/${id}/data'`, root), "denied: '/'");
  assert.equal(
    hideNodePaths(`at '${root}/${id}/uploads/x'`, root),
    "at '<volume root>/" + id + "/uploads/x'",
  );
});
