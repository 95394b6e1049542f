/**
 * A holder that sends an archive naming tags (`docker load` applies those of `manifest.json`)
 * moves none of this engine's tags: a snapshot's archive crafted to name a tag the engine has
 * (as `dormice-base:latest` would be) loads by its image id, and the tag keeps its image.
 */
import assert from "node:assert/strict";
import { DockerExecutor } from "./executor.ts";
import { EngineHttp } from "./_images.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import { dockerSuite } from "./_fixtures_test.ts";
import { runTag } from "./_build_fixtures_test.ts";
import { concat, tarHeader, tarPadding } from "./_tar.ts";

const dockerTest = await dockerSuite("images_test");

/** `tar` with the data of its entry `name` replaced by `data` (plain ustar entries only). */
function replaceEntry(tar: Uint8Array, name: string, data: Uint8Array): Uint8Array {
  let at = 0;
  while (at + 512 <= tar.length) {
    const block = tar.subarray(at, at + 512);
    if (block.every((b) => b === 0)) break;
    const entry = new TextDecoder().decode(block.subarray(0, 100)).replace(/\0.*$/s, "");
    const size = parseInt(new TextDecoder().decode(block.subarray(124, 136)).trim(), 8) || 0;
    const end = at + 512 + size + tarPadding(size).length;
    if (entry === name) {
      return concat([
        tar.subarray(0, at),
        tarHeader({ name, type: "file" }, data.length),
        data,
        tarPadding(data.length),
        tar.subarray(end),
      ]);
    }
    at = end;
  }
  throw new Error(`no entry ${name} in the archive`);
}

dockerTest(
  "DockerExecutor.importImage moves no tag the archive names onto what it loads",
  async () => {
    const tag = runTag();
    const victim = `dormice-loadvictim-${tag}`;
    const http = new EngineHttp(DEFAULT_DOCKER_SOCKET);
    const holder = new DockerExecutor({ nodeId: `imgunit-a-${tag}`, instanceId: `a${tag}` });
    const receiver = new DockerExecutor({ nodeId: `imgunit-b-${tag}`, instanceId: `b${tag}` });
    const base = (await http.inspect("dormice-minimal:latest"))!.id;
    let snapshotId = "";
    let digest = "";
    try {
      await http.tag(base, victim, "latest");
      await holder.create({
        id: "src",
        name: "src",
        template: "minimal",
        spec: { memoryMB: 96 },
        env: {},
      });
      await holder.writeFile("src", "/tmp/x.txt", new TextEncoder().encode("x"));
      snapshotId = (await holder.snapshot("src", { team: "t" })).snapshotId;
      const out = await holder.exportImage(snapshotId, AbortSignal.timeout(60_000));
      digest = out.digest;
      const tar = new Uint8Array(await new Response(out.body).arrayBuffer());
      // What a holder crafted: the snapshot, and a tag of this engine's to move onto it.
      const manifest = JSON.parse(
        new TextDecoder().decode(readEntry(tar, "manifest.json")),
      ) as { RepoTags: string[] | null }[];
      manifest[0].RepoTags = [`${victim}:latest`];
      const crafted = replaceEntry(
        tar,
        "manifest.json",
        new TextEncoder().encode(JSON.stringify(manifest)),
      );
      // The receiver must really load it: the engine holds no copy of that image any more.
      await holder.destroy("src");
      assert.equal(await holder.deleteSnapshot(snapshotId), true);
      assert.equal(await http.inspect(digest), undefined, "the image is gone before the load");

      await receiver.importImage(
        snapshotId,
        ReadableStream.from([crafted]),
        { digest },
        AbortSignal.timeout(60_000),
      );
      assert.deepEqual((await receiver.listSnapshots()).map((s) => s.snapshotId), [snapshotId]);
      assert.equal(
        (await http.inspect(`${victim}:latest`))?.id,
        base,
        "the tag the archive named still names its own image",
      );
      assert.deepEqual((await http.inspect(digest))?.tags, [], "the loaded image has no tag");
    } finally {
      await holder.destroy("src").catch(() => {});
      await receiver.deleteSnapshot(snapshotId).catch(() => {});
      await http.untag(`${victim}:latest`).catch(() => {});
      if (digest) await http.untag(digest).catch(() => {});
      await holder.close();
      await receiver.close();
      http.close();
    }
  },
);

/** The data of entry `name` of `tar` (plain ustar entries only). */
function readEntry(tar: Uint8Array, name: string): Uint8Array {
  let at = 0;
  while (at + 512 <= tar.length) {
    const block = tar.subarray(at, at + 512);
    const entry = new TextDecoder().decode(block.subarray(0, 100)).replace(/\0.*$/s, "");
    const size = parseInt(new TextDecoder().decode(block.subarray(124, 136)).trim(), 8) || 0;
    if (entry === name) return tar.subarray(at + 512, at + 512 + size);
    at += 512 + size + tarPadding(size).length;
  }
  throw new Error(`no entry ${name} in the archive`);
}
