/**
 * ImageMoves' bounds: at most two heals at once (a third is a 503 naming the cap, and two
 * creates of one image share a transfer), the bytes cap, the holder's route without a digest,
 * and parsing the gateway's heal header.
 */
import assert from "node:assert/strict";
import { FakeExecutor } from "./executors/fake.ts";
import { HEAL_FROM_HEADER, ImageMoves, MAX_HEALS_AT_ONCE, parseHealFrom } from "./image_moves.ts";
import { HttpError } from "../shared/http_error.ts";

const token = "fleet-token-0123456789abcdefghijklmnop";
const source = [{ nodeId: "holder", endpoint: "http://127.0.0.1:1" }];

Deno.test("a third heal at once is a 503 naming the cap; a second of one image shares the first", async () => {
  const waiting: (() => void)[] = [];
  let fetches = 0;
  const moves = new ImageMoves({
    executor: new FakeExecutor(),
    token,
    fetch: () => {
      fetches++;
      return new Promise<Response>((resolve) =>
        waiting.push(() => resolve(new Response("no", { status: 404 })))
      );
    },
  });
  const a = moves.heal("snap-aaaaaaaaaaaaaaaaaaaa", source);
  const again = moves.heal("snap-aaaaaaaaaaaaaaaaaaaa", source);
  assert.equal(a, again);
  const b = moves.heal("snap-bbbbbbbbbbbbbbbbbbbb", source);
  assert.throws(
    () => moves.heal("snap-cccccccccccccccccccc", source),
    (e: HttpError) =>
      e.status === 503 && e.message.includes(`the most it gets at once (${MAX_HEALS_AT_ONCE})`),
  );
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(fetches, 2);
  for (const go of waiting) go();
  await assert.rejects(
    a,
    (e: HttpError) => e.status === 503 && /node 'holder': HTTP 404/.test(e.message),
  );
  await assert.rejects(b, HttpError);
  // Once they ended, a heal may start again.
  const c = moves.heal("snap-cccccccccccccccccccc", source);
  await new Promise((r) => setTimeout(r, 0));
  for (const go of waiting.splice(0)) go();
  await assert.rejects(c, HttpError);
});

Deno.test("a holder that sends more than the cap is cut off, and nothing is kept", async () => {
  const executor = new FakeExecutor();
  const moves = new ImageMoves({
    executor,
    token,
    maxBytes: 1000,
    fetch: () =>
      Promise.resolve(
        new Response(new Uint8Array(5000), { headers: { "x-dormice-image-digest": "sha256:x" } }),
      ),
  });
  await assert.rejects(
    moves.heal("snap-aaaaaaaaaaaaaaaaaaaa", source),
    (e: HttpError) => e.status === 503 && /more than 1000 bytes, the heal's cap/.test(e.message),
  );
  assert.deepEqual(await executor.listSnapshots(), []);
});

Deno.test("an answer without a digest is refused before anything is loaded", async () => {
  const executor = new FakeExecutor();
  const moves = new ImageMoves({
    executor,
    token,
    fetch: () => Promise.resolve(new Response("bytes")),
  });
  await assert.rejects(
    moves.heal("snap-aaaaaaaaaaaaaaaaaaaa", source),
    (e: HttpError) => /HTTP 200 without a digest/.test(e.message),
  );
  assert.equal(executor.hooks.calls.importImage, 0);
});

Deno.test("parseHealFrom reads id=endpoint pairs and drops what is not one", () => {
  assert.equal(HEAL_FROM_HEADER, "x-dormice-heal-from");
  assert.deepEqual(parseHealFrom("a=http://127.0.0.1:1, b=https://h:2,bad,c=ftp://x,=http://y"), [
    { nodeId: "a", endpoint: "http://127.0.0.1:1" },
    { nodeId: "b", endpoint: "https://h:2" },
  ]);
  assert.deepEqual(parseHealFrom(null), []);
});

Deno.test("the holder's route serves snapshots only, never an image the engine holds by name", async () => {
  const asked: string[] = [];
  // An executor that exports whatever its engine holds by name, as Docker's does.
  const executor = {
    ...new FakeExecutor(),
    kind: "docker",
    exportImage: (name: string) => {
      asked.push(name);
      return Promise.resolve({
        digest: "sha256:x",
        body: ReadableStream.from([new Uint8Array(1)]),
      });
    },
  } as unknown as FakeExecutor;
  const moves = new ImageMoves({ executor, token });
  const signal = AbortSignal.timeout(1000);
  for (
    const name of [
      "dormice-base:latest",
      "sha256:abc",
      "dormice-snapshot:snap-aaaaaaaaaaaaaaaaaaaa-i1",
      "../x",
    ]
  ) {
    await assert.rejects(
      moves.export(name, signal),
      (e: HttpError) => e.status === 404 && /serves snapshots only/.test(e.message),
    );
  }
  assert.deepEqual(asked, []);
  const res = await moves.export("snap-aaaaaaaaaaaaaaaaaaaa", signal);
  await res.body?.cancel();
  assert.deepEqual(asked, ["snap-aaaaaaaaaaaaaaaaaaaa"]);
});

Deno.test("a snapshot deleted while it heals is not kept: the heal answers 404", async () => {
  const holder = new FakeExecutor();
  await holder.create({ id: "src", name: "src", template: "base", spec: {}, env: {} });
  const { snapshotId } = await holder.snapshot("src", { team: "t" });
  const receiver = new FakeExecutor();
  let release!: () => void;
  const held = new Promise<void>((resolve) => release = resolve);
  let asked!: () => void;
  const fetched = new Promise<void>((resolve) => asked = resolve);
  const moves = new ImageMoves({
    executor: receiver,
    token,
    fetch: async () => {
      asked();
      await held;
      const out = await holder.exportImage(snapshotId, AbortSignal.timeout(1000));
      return new Response(out.body, { headers: { "x-dormice-image-digest": out.digest } });
    },
  });
  const healing = moves.heal(snapshotId, source);
  await fetched;
  // The delete reaches this node while the holder is still sending.
  moves.deleted(snapshotId);
  release();
  await assert.rejects(
    healing,
    (e: HttpError) =>
      e.status === 404 && /was deleted while this node was getting it/.test(e.message),
  );
  assert.deepEqual(await receiver.listSnapshots(), []);
  assert.equal(receiver.hooks.calls.importImage, 1, "the image did arrive before it was dropped");
  // A later heal of the same id is not refused by the earlier delete.
  moves.deleted(snapshotId);
  const again = await moves.heal(snapshotId, source);
  assert.equal(again.from, "holder");
  assert.deepEqual((await receiver.listSnapshots()).map((s) => s.snapshotId), [snapshotId]);
});

Deno.test("a registry snapshot of another team is a 404 and is not pulled", async () => {
  const name = "snap-aaaaaaaaaaaaaaaaaaaa";
  let labels: Record<string, string> = { "dormice.snapshot.team": "team-a" };
  const registryFetch = (input: string | URL | Request) => {
    const url = String(input instanceof Request ? input.url : input);
    if (url.endsWith(`/manifests/${name}`)) {
      return Promise.resolve(
        Response.json({ config: { digest: "sha256:c0" } }, {
          headers: { "docker-content-digest": "sha256:m0" },
        }),
      );
    }
    if (url.endsWith("/blobs/sha256:c0")) {
      return Promise.resolve(Response.json({ config: { Labels: labels } }));
    }
    return Promise.resolve(new Response(null, { status: 404 }));
  };
  const pulled: string[] = [];
  const executor = {
    ...new FakeExecutor(),
    kind: "docker",
    pullImage: (image: string) => {
      pulled.push(image);
      return Promise.resolve();
    },
  } as unknown as FakeExecutor;
  const moves = new ImageMoves({
    executor,
    token,
    registry: "127.0.0.1:1",
    fetch: registryFetch as typeof fetch,
  });
  await assert.rejects(
    moves.heal(name, [], "team-b"),
    (e: HttpError) => e.status === 404 && /Snapshot 'snap-a+' not found/.test(e.message),
  );
  assert.deepEqual(pulled, [], "another team's snapshot was pulled");
  assert.equal((await moves.heal(name, [], "team-a")).from, "registry");
  labels = { ...labels, "dormice.template.public": "true" };
  assert.equal((await moves.heal(name, [], "team-b")).from, "registry", "a published template");
  assert.deepEqual(pulled, [name, name]);
});

Deno.test("with heals off (DORMICE_SNAPSHOT_HEAL=off) a node neither serves nor takes a heal: 503s naming the setting", async () => {
  const executor = new FakeExecutor();
  let fetches = 0;
  const options = {
    executor,
    token,
    fetch: () => {
      fetches++;
      return Promise.resolve(new Response("no", { status: 404 }));
    },
  };
  const off = new ImageMoves({ ...options, heals: false });
  const signal = AbortSignal.timeout(1000);
  await assert.rejects(
    off.export("snap-aaaaaaaaaaaaaaaaaaaa", signal),
    (e: HttpError) =>
      e.status === 503 && /DORMICE_SNAPSHOT_HEAL=off on this node/.test(e.message) &&
      /write DORMICE_SNAPSHOT_HEAL=on/.test(e.message),
  );
  assert.throws(
    () => off.heal("snap-aaaaaaaaaaaaaaaaaaaa", source),
    (e: HttpError) =>
      e.status === 503 && /'snap-aaaaaaaaaaaaaaaaaaaa' is not here/.test(e.message) &&
      /DORMICE_SNAPSHOT_HEAL=off/.test(e.message),
  );
  assert.equal(fetches, 0);
  // Heals on (absent), the same calls reach the executor and the holder.
  const on = new ImageMoves(options);
  const res = await on.export("snap-aaaaaaaaaaaaaaaaaaaa", signal).catch((e: HttpError) => e);
  assert.ok(!(res instanceof HttpError && res.status === 503), "heals on: no 503 for the setting");
  if (res instanceof Response) await res.body?.cancel();
  await assert.rejects(on.heal("snap-aaaaaaaaaaaaaaaaaaaa", source), /HTTP 404/);
  assert.equal(fetches, 1);
});
