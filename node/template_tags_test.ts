import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import {
  MAX_TAGS_PER_TEMPLATE,
  type TagFile,
  type TagFiles,
  TemplateTagStore,
} from "./template_tags.ts";

const ID = `snap-${"a".repeat(20)}`;

Deno.test("TemplateTagStore: a record outlives its store, is stamped, and is dropped", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const clock = new FakeClock(1000);
    const store = new TemplateTagStore(dir, clock);
    assert.equal(await store.get(ID), undefined);
    const target = { buildID: "b1", createdAt: "2026-12-07T00:00:00.000Z" };
    await store.update(ID, () => ({ team: "t", latest: target, tags: { v1: target } }));
    clock.tick(5);
    // Writes of one record run in turn: neither loses the other's tag.
    await Promise.all(
      ["x", "y"].map((tag) =>
        store.update(ID, (held) => ({ ...held!, tags: { ...held!.tags, [tag]: target } }))
      ),
    );
    const again = await new TemplateTagStore(dir, clock).get(ID);
    assert.deepEqual(Object.keys(again!.tags).sort(), ["v1", "x", "y"]);
    assert.equal(again!.updatedAt, 1005);
    assert.equal(again!.latest?.buildID, "b1");
    await store.drop(ID);
    assert.equal(await store.get(ID), undefined);
    assert.equal(await store.get("../../etc/passwd"), undefined, "only template ids are read");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("TemplateTagStore: past its bound of tags a write is refused, the record kept", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new TemplateTagStore(dir);
    const target = { buildID: "b1", createdAt: "2026-12-07T00:00:00.000Z" };
    const many = Object.fromEntries(
      Array.from({ length: MAX_TAGS_PER_TEMPLATE + 1 }, (_, i) => [`t${i}`, target]),
    );
    await store.update(ID, () => ({ team: "t", tags: { v1: target } }));
    await assert.rejects(store.update(ID, () => ({ team: "t", tags: many })), /at most/);
    assert.deepEqual(Object.keys((await store.get(ID))!.tags), ["v1"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("TemplateTagStore: a crashed or failed write leaves no partial file for good", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const target = { buildID: "b1", createdAt: "2026-12-07T00:00:00.000Z" };
    // A process that crashed between a write and its rename left these.
    await Deno.writeTextFile(`${dir}/${ID}.json.0badc0de.part`, '{"team":"t","ta');
    await Deno.writeTextFile(`${dir}/${ID}.json.1badc0de.part`, "");
    const store = new TemplateTagStore(dir);
    await store.update(ID, () => ({ team: "t", tags: { v1: target } }));
    const names = async () => {
      const all: string[] = [];
      for await (const e of Deno.readDir(dir)) all.push(e.name);
      return all.sort();
    };
    assert.deepEqual(await names(), [`${ID}.json`]);
    // A write that fails (here the rename: a directory stands at the record's path).
    const other = `snap-${"b".repeat(20)}`;
    await Deno.mkdir(`${dir}/${other}.json/x`, { recursive: true });
    for (let i = 0; i < 3; i++) {
      await assert.rejects(store.update(other, () => ({ team: "t", tags: {} })));
    }
    assert.deepEqual(await names(), [`${ID}.json`, `${other}.json`]);
    await assert.rejects(
      store.update("../../../tmp/x", () => ({ team: "t", tags: {} })),
      /is not a template id/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("TemplateTagStore: a record is flushed before its rename, and the rename after it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const steps: string[] = [];
    const name = (path: string) =>
      path === dir ? "<dir>" : path.endsWith(".part") ? "<part>" : path;
    const files: TagFiles = {
      async open(path, options) {
        const file: TagFile = await Deno.open(path, options);
        return {
          write: (bytes) => {
            steps.push(`write ${name(path)}`);
            return file.write(bytes);
          },
          sync: () => {
            steps.push(`sync ${name(path)}`);
            return file.sync();
          },
          close: () => file.close(),
        };
      },
      async rename(from, to) {
        steps.push(`rename ${name(from)}`);
        await Deno.rename(from, to);
      },
    };
    const store = new TemplateTagStore(dir, new FakeClock(1000), files);
    const target = { buildID: "b1", createdAt: "2026-12-07T00:00:00.000Z" };
    await store.update(ID, () => ({ team: "t", tags: { v1: target } }));
    assert.deepEqual(steps.filter((s, i) => s !== steps[i - 1]), [
      "write <part>",
      "sync <part>",
      "rename <part>",
      "sync <dir>",
    ]);
    assert.deepEqual(Object.keys((await store.get(ID))!.tags), ["v1"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
