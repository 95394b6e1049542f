import assert from "node:assert/strict";
import { join } from "node:path";
import { statfs } from "node:fs/promises";
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

Deno.test("exportVolume() and importVolume() carry a sparse file as sparse, counting its data against the cap", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const src = join(dir, "src");
    await Deno.mkdir(src);
    // On ext4 the export stops reading once it found every block the file takes: 64 GiB
    // apparent are not read. Elsewhere (a filesystem that may compress) it reads to the end.
    const ext4 = (await statfs(dir)).type === 0xef53;
    // A few KiB of data: at the start, and at 1 GiB + 100 (not sector-aligned).
    const size = (ext4 ? 64 : 2) * 2 ** 30;
    {
      using f = await Deno.open(join(src, "disk.img"), { write: true, create: true });
      await f.truncate(size);
      await f.write(new TextEncoder().encode("head"));
      await f.seek(2 ** 30 + 100, Deno.SeekMode.Start);
      await f.write(new Uint8Array(5000).fill(7));
    }
    // Data in the last, partial sector of a file with holes.
    {
      using f = await Deno.open(join(src, "tail.img"), { write: true, create: true });
      await f.truncate(2 ** 21 + 3);
      await f.seek(2 ** 21, Deno.SeekMode.Start);
      await f.write(new TextEncoder().encode("end"));
    }
    // A file of holes only, and an ordinary one beside them.
    {
      using f = await Deno.open(join(src, "empty.img"), { write: true, create: true });
      await f.truncate(ext4 ? 2 ** 40 : 2 ** 30);
    }
    await Deno.writeTextFile(join(src, "plain.txt"), "plain");
    const bytes = await importVolume(exportVolume(src), join(dir, "dst"), 1e6);
    assert.ok(bytes < 20_000, `only the data counts: ${bytes}`);
    const disk = join(dir, "dst", "disk.img");
    const info = await Deno.stat(disk);
    assert.equal(info.size, size);
    assert.ok(info.blocks! * 512 < 1e6, "the copy is sparse too");
    using f = await Deno.open(disk, { read: true });
    const at = async (offset: number, n: number) => {
      await f.seek(offset, Deno.SeekMode.Start);
      const b = new Uint8Array(n);
      let got = 0;
      while (got < n) got += (await f.read(b.subarray(got)))!;
      return b;
    };
    assert.equal(new TextDecoder().decode(await at(0, 4)), "head");
    assert.deepEqual(await at(2 ** 30 + 99, 5002), Uint8Array.from([0, ...Array(5000).fill(7), 0]));
    const tail = await Deno.readFile(join(dir, "dst", "tail.img"));
    assert.equal(tail.length, 2 ** 21 + 3);
    assert.equal(new TextDecoder().decode(tail.subarray(2 ** 21)), "end");
    assert.ok(tail.subarray(0, 2 ** 21).every((b) => b === 0));
    assert.equal((await Deno.stat(join(dir, "dst", "empty.img"))).size, ext4 ? 2 ** 40 : 2 ** 30);
    assert.equal(await Deno.readTextFile(join(dir, "dst", "plain.txt")), "plain");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("importVolume(): a sparse entry's records stay inside its size and in order", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const rec = (offset: number, bytes: Uint8Array) => {
      const out = new Uint8Array(12 + bytes.length);
      new DataView(out.buffer).setUint32(0, bytes.length);
      new DataView(out.buffer).setBigUint64(4, BigInt(offset));
      out.set(bytes, 12);
      return out;
    };
    const header = { path: "f", type: "sparse", mode: 0o644, size: 100 };
    for (
      const records of [[rec(98, new Uint8Array(4))], [
        rec(50, new Uint8Array(4)),
        rec(0, new Uint8Array(1)),
      ]]
    ) {
      const err = await importVolume(
        streamOf(entry(header), ...records, new Uint8Array(4), new Uint8Array(4)),
        join(dir, "dst"),
        1e6,
      ).catch((e) => e);
      assert.ok(err instanceof HttpError, String(err));
      assert.equal(err.status, 400);
      assert.match(err.message, /A sparse entry of '\/f' has a bad record/);
    }
    // Past the cap by its data, not its size.
    const full = await importVolume(
      streamOf(entry({ ...header, size: 1e9 }), rec(0, new Uint8Array(2000)), new Uint8Array(4)),
      join(dir, "dst"),
      1000,
    ).catch((e) => e);
    assert.equal(full.status, 507);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
