import assert from "node:assert/strict";
import { concat, readTar, TAR_END, tarHeader, tarPadding, writeTar } from "./_tar.ts";

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
