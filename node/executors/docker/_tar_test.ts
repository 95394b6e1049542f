import assert from "node:assert/strict";
import {
  concat,
  readFirstTarEntry,
  readTar,
  TAR_END,
  tarHeader,
  tarPadding,
  writeTar,
} from "./_tar.ts";

Deno.test("writeTar() and readTar() keep every byte, long names and directories", () => {
  const data = new Uint8Array(1500);
  for (let i = 0; i < data.length; i++) data[i] = i & 0xff;
  const long = "d/".repeat(70) + "file-with-a-long-name.bin";
  const tar = writeTar([
    { name: "dir", type: "dir", mtimeMs: 1_700_000_000_000 },
    { name: "dir/a.bin", type: "file", data, mode: 0o600, uid: 1000, gid: 1000 },
    { name: long, type: "file", data: new Uint8Array([0]) },
    { name: "empty", type: "file" },
  ]);
  assert.equal(tar.length % 512, 0);
  const entries = readTar(tar);
  assert.deepEqual(entries.map((e) => [e.name, e.type, e.size]), [
    ["dir/", "dir", 0],
    ["dir/a.bin", "file", 1500],
    [long, "file", 1],
    ["empty", "file", 0],
  ]);
  assert.deepEqual(entries[1].data, data);
  assert.equal(entries[1].mode, 0o600);
  assert.equal(entries[0].mtimeMs, 1_700_000_000_000);
});

Deno.test("readTar() refuses a corrupt header", () => {
  const tar = writeTar([{ name: "a", type: "file", data: new Uint8Array([1]) }]);
  tar[0] = "b".charCodeAt(0);
  assert.throws(() => readTar(tar), /bad header checksum/);
});

Deno.test("tarHeader() + the data + tarPadding() + TAR_END is the archive writeTar() builds", () => {
  const data = new Uint8Array(700).fill(7);
  const long = "x/".repeat(60) + "streamed.bin";
  for (const name of ["a.bin", long]) {
    const entry = { name, type: "file" as const, mode: 0o644, mtimeMs: 1_700_000_000_000 };
    const streamed = concat([
      tarHeader(entry, data.length),
      data,
      tarPadding(data.length),
      TAR_END,
    ]);
    assert.deepEqual(streamed, writeTar([{ ...entry, data }]));
  }
  assert.equal(tarPadding(1024).length, 0);
});

Deno.test("readFirstTarEntry() reads no further than the first entry", async () => {
  const big = new Uint8Array(100_000).map((_, i) => i % 256);
  const dirFirst = writeTar([
    { name: "d", type: "dir" },
    { name: "d/big", type: "file", data: big },
  ]);
  const fileFirst = writeTar([
    { name: "f".repeat(150), type: "file", data: big },
    { name: "other", type: "file", data: big },
  ]);
  // The archive in 4 KiB chunks, then 1,000 chunks of zeros: a directory's tree is long.
  const counted = (tar: Uint8Array) => {
    const state = { pulled: 0 };
    async function* chunks() {
      for (let at = 0; state.pulled < 1000; at += 4096) {
        state.pulled++;
        yield at < tar.length ? tar.slice(at, at + 4096) : new Uint8Array(4096);
      }
    }
    return { state, chunks: chunks() };
  };
  const dir = counted(dirFirst);
  const entry = await readFirstTarEntry(dir.chunks);
  assert.equal(entry?.type, "dir");
  assert.equal(dir.state.pulled, 1);
  const file = counted(fileFirst);
  const first = await readFirstTarEntry(file.chunks);
  assert.equal(first?.name, "f".repeat(150));
  assert.deepEqual(first?.data, big);
  // The PAX header, the header and 100,000 bytes: 26 chunks of 4 KiB, not the second file.
  assert.ok(file.state.pulled <= 26, `${file.state.pulled} chunks pulled`);
});
