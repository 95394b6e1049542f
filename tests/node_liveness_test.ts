/**
 * A node stays responsive under one tenant's load: a real `node/main.ts` process on
 * the fake executor is sent a 9 MB gzip of zeros (9,000 MiB inflated) at envd's `/files`, and
 * its `/healthz` is asked again and again while the upload is refused. Each answer must arrive
 * within 1 s (the bound is generous for a loaded 2-core machine: before the gzip was inflated in
 * slices, `/healthz` waited 1.5 s and more behind one upload); afterwards the node still serves
 * an upload and its read.
 */
import assert from "node:assert/strict";
import zlib from "node:zlib";
import { type NodeProcess, startNode } from "./_processes.ts";
import { gzipOfZeros } from "./support/gzip_bomb.ts";

/** A sandbox on `node` through its E2B control plane, and the headers its envd takes. */
async function sandboxOn(node: NodeProcess): Promise<Record<string, string>> {
  const res = await fetch(`${node.url}/e2b/api/sandboxes`, {
    method: "POST",
    headers: { "x-api-key": node.token, "content-type": "application/json" },
    body: JSON.stringify({ templateID: "base" }),
  });
  assert.equal(res.status, 201, await res.clone().text());
  const { sandboxID, envdAccessToken } = await res.json();
  return { "E2b-Sandbox-Id": sandboxID, "X-Access-Token": envdAccessToken };
}

/**
 * Posts `body` as a gzip upload to `path` while asking `/healthz` back to back; every answer must
 * be a 200 within 1 s. Returns the upload's answer and how many health answers came meanwhile.
 */
async function uploadWhileAskingHealth(
  node: NodeProcess,
  envd: Record<string, string>,
  body: Uint8Array<ArrayBuffer>,
  path: string,
): Promise<{ status: number; body: { code: number; message: string }; answers: number }> {
  let uploading = true;
  let answers = 0;
  const failures: string[] = [];
  const asking = (async () => {
    while (uploading) {
      try {
        const res = await fetch(`${node.url}/healthz`, { signal: AbortSignal.timeout(1000) });
        await res.body?.cancel();
        if (res.status !== 200) failures.push(`/healthz answered ${res.status}`);
        else if (uploading) answers++;
      } catch (error) {
        failures.push(`/healthz did not answer within 1 s (${(error as Error).name})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  })();
  try {
    const res = await fetch(`${node.url}/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: {
        ...envd,
        "content-type": "application/octet-stream",
        "content-encoding": "gzip",
      },
      body,
    });
    const answer = await res.json();
    uploading = false;
    await asking;
    assert.deepEqual(failures, [], "the node's /healthz was held up during the upload");
    return { status: res.status, body: answer, answers };
  } finally {
    uploading = false;
    await asking;
  }
}

/** The node serves a small gzip upload and reads it back. */
async function stillWorks(node: NodeProcess, envd: Record<string, string>): Promise<void> {
  const text = "still here\n".repeat(100);
  const put = await fetch(`${node.url}/e2b/envd/files?path=/tmp/after.txt`, {
    method: "POST",
    headers: { ...envd, "content-type": "application/octet-stream", "content-encoding": "gzip" },
    body: new Uint8Array(zlib.gzipSync(text)),
  });
  assert.equal(put.status, 200, await put.clone().text());
  await put.body?.cancel();
  const got = await fetch(`${node.url}/e2b/envd/files?path=/tmp/after.txt`, { headers: envd });
  assert.equal(await got.text(), text);
}

Deno.test({
  name: "a node answers /healthz while a 9 MB gzip bomb is refused, and works afterwards",
  async fn(t) {
    const bomb = gzipOfZeros(9000);
    assert.ok(bomb.length > 9_000_000, `the bomb is ${bomb.length} bytes`);
    // One node with the ratio cap off, so the bomb is inflated up to the upload cap (256 MiB of
    // work to share the loop with, staged on disk too: more only adds time on a loaded machine);
    // one with the defaults, where the ratio refuses it after its first MiB. Before the gzip was
    // inflated in slices, the second held the loop past 1 s on its way to the 1 GiB cap.
    const [open, plain] = await Promise.all([
      startNode({
        env: { DORMICE_UPLOAD_GZIP_MAX_RATIO: "1032", DORMICE_UPLOAD_LIMIT_MB: "256" },
      }),
      startNode(),
    ]);
    try {
      await t.step("inflated to the upload cap: /healthz answers all along", async () => {
        const envd = await sandboxOn(open);
        const r = await uploadWhileAskingHealth(open, envd, bomb, "/dev/null");
        assert.equal(r.status, 413, JSON.stringify(r.body));
        assert.equal(r.body.code, 413);
        assert.match(r.body.message, /cap of 256 MiB .*DORMICE_UPLOAD_LIMIT_MB/);
        // The precondition: the health answers really came while the bomb was being inflated.
        assert.ok(r.answers >= 3, `only ${r.answers} /healthz answers during the upload`);
        await stillWorks(open, envd);
      });
      await t.step("with the default ratio cap: a 413 naming it, the node unharmed", async () => {
        const envd = await sandboxOn(plain);
        const r = await uploadWhileAskingHealth(plain, envd, bomb, "/tmp/bomb.bin");
        assert.equal(r.status, 413, JSON.stringify(r.body));
        assert.equal(r.body.code, 413);
        assert.match(r.body.message, /more than 100 times .*DORMICE_UPLOAD_GZIP_MAX_RATIO/);
        const gone = await fetch(`${plain.url}/e2b/envd/files?path=/tmp/bomb.bin`, {
          headers: envd,
        });
        assert.equal(gone.status, 404);
        await gone.body?.cancel();
        await stillWorks(plain, envd);
      });
    } finally {
      await Promise.all([open.stop(), plain.stop()]);
    }
  },
});
