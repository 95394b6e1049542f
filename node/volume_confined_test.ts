import assert from "node:assert/strict";
import { join } from "node:path";
import { confinedRenames } from "./volume_confined.ts";

/**
 * A volume whose directory `a` was checked, then swapped by a sandbox for a link to a node
 * directory: what a path call made after the check meets.
 */
async function swapped() {
  const base = await Deno.realPath(await Deno.makeTempDir());
  const data = join(base, "data");
  const outside = join(base, "outside");
  const node = join(base, "uploads");
  for (const d of [data, outside, node]) await Deno.mkdir(d);
  await Deno.mkdir(join(data, "a"));
  const checked = join(data, "a");
  await Deno.rename(checked, join(data, "a-real"));
  await Deno.symlink(outside, checked);
  return {
    data,
    outside,
    node,
    checked,
    async [Symbol.asyncDispose]() {
      await Deno.remove(base, { recursive: true });
    },
  };
}

Deno.test("confinedRenames: an upload renamed into a checked directory swapped for a link stays out of the link's target", async () => {
  const renames = confinedRenames();
  assert.ok(renames, "the test runs with --allow-run");
  await using v = await swapped();
  await Deno.writeTextFile(join(v.node, "body"), "root::0:0::/:/bin/sh");
  // The hazard: a path call after the swap lands outside.
  await Deno.copyFile(join(v.node, "body"), join(v.node, "body2"));
  await Deno.rename(join(v.node, "body2"), join(v.checked, "passwd"));
  assert.deepEqual([...Deno.readDirSync(v.outside)].map((e) => e.name), ["passwd"]);
  await Deno.remove(join(v.outside, "passwd"));
  // The confined rename sees the directory is not the checked one.
  await assert.rejects(
    renames.into(v.checked, "passwd", join(v.node, "body")),
    /was moved or replaced while the node used it/,
  );
  assert.deepEqual([...Deno.readDirSync(v.outside)], []);
});

Deno.test("confinedRenames: a removal's move out of a swapped directory leaves the link's target alone", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  await Deno.mkdir(join(v.outside, "victim"));
  await assert.rejects(
    renames.outOf(v.checked, "victim", join(v.node, "trash")),
    /was moved or replaced/,
  );
  assert.ok(Deno.statSync(join(v.outside, "victim")).isDirectory);
});

Deno.test("confinedRenames: in and out of a directory that is what was checked, a link in the final place replaced", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  const dir = join(v.data, "a-real");
  await Deno.symlink(v.outside, join(dir, "f"));
  await Deno.writeTextFile(join(v.node, "body"), "x");
  await renames.into(dir, "f", join(v.node, "body"));
  assert.equal(Deno.lstatSync(join(dir, "f")).isFile, true, "the link was replaced");
  assert.deepEqual([...Deno.readDirSync(v.outside)], []);
  await renames.outOf(dir, "f", join(v.node, "gone"));
  assert.equal(Deno.readTextFileSync(join(v.node, "gone")), "x");
  await assert.rejects(renames.outOf(dir, "f", join(v.node, "again")), /not found/);
  // Names a shell would read as options or globs are plain names.
  await Deno.writeTextFile(join(v.node, "body"), "y");
  await renames.into(dir, "-rf *", join(v.node, "body"));
  assert.equal(Deno.readTextFileSync(join(dir, "-rf *")), "y");
});

Deno.test("confinedRenames: a read's hard link in a swapped directory is refused, and links a link itself", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  await Deno.writeTextFile(join(v.outside, "shadow"), "root:secret");
  // The hazard: a read by path after the swap reads the link's target.
  assert.equal(await Deno.readTextFile(join(v.checked, "shadow")), "root:secret");
  await assert.rejects(
    renames.linkOut(v.checked, "shadow", join(v.node, "read")),
    /was moved or replaced/,
  );
  assert.deepEqual([...Deno.readDirSync(v.node)], []);
  // In the checked directory, a final link swapped in is linked as the link, not its target.
  const dir = join(v.data, "a-real");
  await Deno.symlink(join(v.outside, "shadow"), join(dir, "f"));
  await renames.linkOut(dir, "f", join(v.node, "read"));
  assert.equal(Deno.lstatSync(join(v.node, "read")).isSymlink, true);
  // A directory cannot be hard-linked: a 400 naming it.
  await Deno.mkdir(join(dir, "sub"));
  await assert.rejects(renames.linkOut(dir, "sub", join(v.node, "sub")), /is a directory/);
});

Deno.test("confinedRenames: a directory made on the node's side and renamed into a swapped directory stays out of the link's target", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  await Deno.mkdir(join(v.node, "made"));
  await assert.rejects(renames.into(v.checked, "new", join(v.node, "made")), /was moved/);
  assert.deepEqual([...Deno.readDirSync(v.outside)], []);
  // Over a directory that is not empty: a 409, nothing replaced.
  const dir = join(v.data, "a-real");
  await Deno.mkdir(join(dir, "full"));
  await Deno.writeTextFile(join(dir, "full", "kept"), "k");
  await assert.rejects(renames.into(dir, "full", join(v.node, "made")), /changed type/);
  assert.equal(Deno.readTextFileSync(join(dir, "full", "kept")), "k");
});

Deno.test("confinedRenames: a directory's mode and owner change from inside it, never through a swapped path", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  // The hazard: a chmod by path after the swap changes the link's target.
  await Deno.chmod(v.checked, 0o711);
  assert.equal(Deno.statSync(v.outside).mode! & 0o777, 0o711);
  await Deno.chmod(v.outside, 0o700);
  await assert.rejects(renames.changeDir(v.checked, "/a", 0o777), /was moved or replaced/);
  assert.equal(Deno.statSync(v.outside).mode! & 0o777, 0o700, "the link's target kept its mode");
  const dir = join(v.data, "a-real");
  await renames.changeDir(dir, "/a-real", 0o750, Deno.statSync(dir).uid ?? undefined);
  assert.equal(Deno.statSync(dir).mode! & 0o7777, 0o750);
});

Deno.test("confinedRenames: a listing from inside the checked directory, never of a swapped one", async () => {
  const renames = confinedRenames()!;
  await using v = await swapped();
  await Deno.writeTextFile(join(v.outside, "id_rsa"), "k");
  // The hazard: a listing by path after the swap lists the link's target.
  assert.deepEqual([...Deno.readDirSync(v.checked)].map((e) => e.name), ["id_rsa"]);
  await assert.rejects(renames.list(v.checked, "/a", 1, 100), /was moved or replaced/);
  await assert.rejects(renames.stat(v.checked, "id_rsa", "/a/id_rsa"), /was moved or replaced/);
  const dir = join(v.data, "a-real");
  await Deno.mkdir(join(dir, "sub"));
  await Deno.writeTextFile(join(dir, "sub", "new\nline"), "abc");
  await Deno.symlink(v.outside, join(dir, "out"));
  const listed = await renames.list(dir, "/a-real", 2, 100);
  assert.deepEqual(
    listed.map((e) => [e.path, e.type, e.type === "file" ? e.size : 0, e.target]).sort(),
    [
      ["out", "symlink", 0, v.outside],
      ["sub", "directory", 0, undefined],
      ["sub/new\nline", "file", 3, undefined],
    ],
  );
  assert.equal((await renames.stat(dir, "out", "/a-real/out")).type, "symlink");
  await assert.rejects(renames.stat(dir, "none", "/a-real/none"), /not found/);
  await assert.rejects(renames.list(dir, "/a-real", 2, 2), /over 2 entries/);
});
