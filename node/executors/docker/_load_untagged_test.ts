import assert from "node:assert/strict";
import { withoutImageTags } from "./_load_untagged.ts";
import { readTar, writeTar } from "./_tar.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

async function through(tar: Uint8Array, chunk = 700): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for (let i = 0; i < tar.length; i += chunk) parts.push(tar.slice(i, i + chunk));
  return new Uint8Array(
    await new Response(withoutImageTags(ReadableStream.from(parts))).arrayBuffer(),
  );
}

Deno.test("withoutImageTags clears manifest.json's tags, drops repositories, keeps the layers", async () => {
  const layer = crypto.getRandomValues(new Uint8Array(3000));
  const tar = writeTar([
    { name: "abc", type: "dir" },
    { name: "abc/layer.tar", type: "file", data: layer },
    {
      name: "manifest.json",
      type: "file",
      data: enc.encode(JSON.stringify([{ Config: "c.json", RepoTags: ["dormice-base:latest"] }])),
    },
    { name: "repositories", type: "file", data: enc.encode('{"dormice-base":{"latest":"x"}}') },
    {
      name: "index.json",
      type: "file",
      data: enc.encode(JSON.stringify({
        manifests: [{
          digest: "d",
          annotations: { "io.containerd.image.name": "dormice-base:latest" },
        }],
      })),
    },
  ]);
  const out = readTar(await through(tar));
  assert.deepEqual(out.map((e) => e.name), [
    "abc/",
    "abc/layer.tar",
    "manifest.json",
    "index.json",
  ]);
  assert.deepEqual(out[1].data, layer);
  assert.deepEqual(JSON.parse(dec.decode(out[2].data)), [{ Config: "c.json", RepoTags: null }]);
  assert.deepEqual(JSON.parse(dec.decode(out[3].data)), { manifests: [{ digest: "d" }] });
});

Deno.test("withoutImageTags finds a manifest named through a PAX path", async () => {
  // A name past 100 bytes is written as a PAX header; `./` many times over is still the root's.
  const name = "./".repeat(60) + "manifest.json";
  const tar = writeTar([
    { name, type: "file", data: enc.encode(JSON.stringify([{ RepoTags: ["victim:latest"] }])) },
  ]);
  const out = readTar(await through(tar, 512));
  assert.deepEqual(out.map((e) => e.name), ["manifest.json"]);
  assert.deepEqual(JSON.parse(dec.decode(out[0].data)), [{ RepoTags: null }]);
});

Deno.test("withoutImageTags refuses a cut archive and an oversized manifest", async () => {
  const tar = writeTar([{ name: "a/layer.tar", type: "file", data: new Uint8Array(5000) }]);
  await assert.rejects(
    through(tar.subarray(0, 2048)),
    /no image archive: it ended inside a\/layer.tar/,
  );
  const big = writeTar([{
    name: "manifest.json",
    type: "file",
    data: new Uint8Array(5 * 1024 * 1024),
  }]);
  await assert.rejects(through(big, 1 << 20), /manifest.json has 5242880 bytes \(most 4194304\)/);
});
