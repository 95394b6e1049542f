import assert from "node:assert/strict";
import { join } from "node:path";
import { exportVolume, importVolume } from "./volume_copy.ts";
import { HttpError } from "../shared/http_error.ts";
import { splitVolumePath } from "./volume_paths.ts";

/** One entry of the stream format, by hand (a hostile or broken sender). */
function entry(header: Record<string, unknown>, bytes = new Uint8Array(0)): Uint8Array {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(4 + json.length + bytes.length);
  new DataView(out.buffer).setUint32(0, json.length);
  out.set(json, 4);
  out.set(bytes, 4 + json.length);
  return out;
}

const streamOf = (...chunks: Uint8Array[]) => ReadableStream.from(chunks);

Deno.test("exportVolume() and importVolume() copy files, modes and directories", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const src = join(dir, "src");
    await Deno.mkdir(join(src, "a", "b"), { recursive: true });
    await Deno.writeTextFile(join(src, "a", "b", "f.txt"), "hello");
    await Deno.writeFile(join(src, "big.bin"), new Uint8Array(300_000).map((_, i) => i % 7));
    await Deno.chmod(join(src, "a", "b", "f.txt"), 0o600);
    const bytes = await importVolume(exportVolume(src), join(dir, "dst"), 1e6);
    assert.equal(bytes, 300_005);
    assert.equal(await Deno.readTextFile(join(dir, "dst", "a", "b", "f.txt")), "hello");
    assert.equal((await Deno.stat(join(dir, "dst", "a", "b", "f.txt"))).mode! & 0o777, 0o600);
    assert.equal((await Deno.readFile(join(dir, "dst", "big.bin")))[299_999], 299_999 % 7);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "exportVolume() and importVolume() keep each file's and directory's owner (as root)",
  ignore: Deno.uid() !== 0,
}, async () => {
  const dir = await Deno.makeTempDir();
  try {
    const src = join(dir, "src");
    await Deno.mkdir(join(src, "work"), { recursive: true });
    await Deno.writeTextFile(join(src, "work", "notes.txt"), "mine");
    await Deno.chown(join(src, "work"), 1000, 1000);
    await Deno.chown(join(src, "work", "notes.txt"), 1000, 1001);
    await Deno.chmod(join(src, "work", "notes.txt"), 0o2644);
    await importVolume(exportVolume(src), join(dir, "dst"), 1e6);
    const d = await Deno.stat(join(dir, "dst", "work"));
    const f = await Deno.stat(join(dir, "dst", "work", "notes.txt"));
    assert.deepEqual([d.uid, d.gid, f.uid, f.gid], [1000, 1000, 1000, 1001]);
    assert.equal(f.mode! & 0o7777, 0o2644, "the mode, set-id bits too, survives the chown");
    // An owner no node can give is refused by the kernel's rules, not by a crash.
    const odd = await importVolume(
      ReadableStream.from([
        entry({ path: "x", type: "file", mode: 0o644, size: 0, uid: -1, gid: 2 ** 40 }),
        new Uint8Array(4),
      ]),
      join(dir, "odd"),
      1e6,
    );
    assert.equal(odd, 0);
    assert.equal((await Deno.stat(join(dir, "odd", "x"))).uid, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("importVolume() refuses more than the cap (507) and leaves nothing behind", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const stream = streamOf(
      entry({ path: "x", type: "file", mode: 0o644, size: 10 }, new Uint8Array(10)),
      new Uint8Array(4),
    );
    await assert.rejects(
      importVolume(stream, join(dir, "dst"), 5),
      (e) => e instanceof HttpError && e.status === 507,
    );
    await assert.rejects(Deno.stat(join(dir, "dst")), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("importVolume() refuses an entry whose path leaves the volume (400)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const stream = streamOf(
      entry({ path: "../outside", type: "file", mode: 0o644, size: 1 }, new Uint8Array(1)),
      new Uint8Array(4),
    );
    await assert.rejects(
      importVolume(stream, join(dir, "dst"), 100),
      (e) => e instanceof HttpError && e.status === 400 && /leaves the volume/.test(e.message),
    );
    await assert.rejects(Deno.stat(join(dir, "outside")), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("splitVolumePath() takes the root in every spelling and refuses '..' and NUL", () => {
  for (const root of ["/", "", ".", "//./"]) assert.deepEqual(splitVolumePath(root), []);
  assert.deepEqual(splitVolumePath("/a//b/./c"), ["a", "b", "c"]);
  assert.throws(() => splitVolumePath("/a/../../b"), /leaves the volume/);
  assert.throws(() => splitVolumePath("a\0b"), /NUL/);
  assert.throws(() => splitVolumePath(null), /'path' is required/);
});
