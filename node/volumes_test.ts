import assert from "node:assert/strict";
import { MAX_WRITES_IN_FLIGHT, NodeVolumes, USAGE_TTL_MS } from "./volumes.ts";

const id = "vol-0123456789abcdef0123";

Deno.test("node volumes: writes within the usage TTL share one walk, and the count follows them", async () => {
  const root = await Deno.makeTempDir();
  try {
    let now = 1_000_000;
    let walks = 0;
    const volumes = new NodeVolumes({
      root,
      shared: false,
      defaultSizeBytes: 1000,
      sandboxes: () => [],
      now: () => now,
      onWalk: () => walks++,
    });
    await volumes.create(id);
    for (let i = 0; i < 5; i++) {
      const w = await volumes.beginWrite(id, 0);
      w.add(100);
      w.end(true);
    }
    assert.equal(walks, 1);
    // The count moved by the writes: 500 of 1000 used, so 600 more do not fit.
    const full = await volumes.beginWrite(id, 0);
    assert.throws(() => full.add(600), /is full: its cap is 1000 bytes/);
    full.end(false);
    now += USAGE_TTL_MS;
    await volumes.beginWrite(id, 0);
    assert.equal(walks, 2);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes: a start sweeps the bodies of writes a stopped node left", async () => {
  const root = await Deno.makeTempDir();
  try {
    const volumes = new NodeVolumes({
      root,
      shared: false,
      defaultSizeBytes: 1000,
      sandboxes: () => [],
    });
    await volumes.create(id);
    await Deno.writeTextFile(`${volumes.uploadsDir(id)}/half`, "x");
    await volumes.sweepUploads();
    // Emptied, and kept (a content-API delete moves what it removes into it).
    assert.deepEqual([...Deno.readDirSync(volumes.uploadsDir(id))], []);
    assert.ok(volumes.has(id));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes: a slow walk is trusted ten times as long as it took", async () => {
  const root = await Deno.makeTempDir();
  try {
    let now = 0;
    let walks = 0;
    const volumes = new NodeVolumes({
      root,
      shared: false,
      defaultSizeBytes: 1000,
      sandboxes: () => [],
      now: () => now,
      // Each walk takes 20 s of the injected clock.
      onWalk: () => {
        walks++;
        now += 20_000;
      },
    });
    await volumes.create(id);
    await volumes.beginWrite(id, 0);
    now += 150_000;
    await volumes.beginWrite(id, 0);
    assert.equal(walks, 1);
    now += 50_000;
    await volumes.beginWrite(id, 0);
    assert.equal(walks, 2);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes: a volume takes at most MAX_WRITES_IN_FLIGHT writes at once", async () => {
  const root = await Deno.makeTempDir();
  try {
    const volumes = new NodeVolumes({
      root,
      shared: false,
      defaultSizeBytes: 1000,
      sandboxes: () => [],
    });
    await volumes.create(id);
    const writes = [];
    for (let i = 0; i < MAX_WRITES_IN_FLIGHT; i++) writes.push(await volumes.beginWrite(id, 0));
    await assert.rejects(volumes.beginWrite(id, 0), /64 writes in flight/);
    // An ended write frees its place, once however often it is ended.
    writes[0].end(false);
    writes[0].end(false);
    await volumes.beginWrite(id, 0);
    await assert.rejects(volumes.beginWrite(id, 0), /writes in flight/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
