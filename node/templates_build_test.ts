import assert from "node:assert/strict";
import type { HttpError } from "../shared/http_error.ts";
import type { SnapshotInfo } from "./executors/contract.ts";
import {
  type BuildIo,
  TemplateBuildError,
  type TemplateBuildSpec,
} from "./executors/template_build.ts";
import { buildInfo, type BuildRecord, TemplateBuilds } from "./templates_build.ts";

const HASH = "a".repeat(64);

function spec(buildId: string, team = "t1"): TemplateBuildSpec {
  return {
    templateId: "snap-aaaaaaaaaaaaaaaaaaaa",
    buildId,
    team,
    name: "tpl",
    fromTemplate: "base",
    steps: [],
    force: false,
  };
}

/** An executor whose builds wait until `finish` or their signal. */
function heldBuilder() {
  const waiting: { resolve: () => void; io: BuildIo }[] = [];
  return {
    waiting,
    buildTemplate(s: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
      return new Promise((resolve, reject) => {
        io.signal.addEventListener("abort", () => reject(io.signal.reason), { once: true });
        waiting.push({
          io,
          resolve: () =>
            resolve({
              snapshotId: s.templateId,
              team: s.team,
              name: s.name,
              sandboxId: "",
              template: "base",
              node: "n",
              createdAt: 0,
              sizeBytes: 0,
            }),
        });
      });
    },
  };
}

async function settled(record: BuildRecord): Promise<void> {
  for (let i = 0; i < 1000 && record.status === "building"; i++) {
    await new Promise((r) => queueMicrotask(() => r(undefined)));
    await Promise.resolve();
  }
}

Deno.test("TemplateBuilds refuses a build past its bound with a 429 naming the setting", async () => {
  const executor = heldBuilder();
  const dir = await Deno.makeTempDir();
  const builds = new TemplateBuilds({ executor, dir, maxBuilds: 1 });
  builds.start(spec("b1"));
  assert.throws(() => builds.start(spec("b2")), (e: HttpError) => {
    assert.equal(e.status, 429);
    assert.match(e.message, /DORMICE_TEMPLATE_BUILDS=1/);
    return true;
  });
  executor.waiting[0].resolve();
  const record = builds.get(spec("b1").templateId, "b1", "t1");
  await settled(record);
  assert.equal(record.status, "ready");
  assert.equal(builds.running, 0);
  builds.start(spec("b3"));
  executor.waiting[1].resolve();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds answers a failed step with its name and its lines, and keeps teams apart", async () => {
  const dir = await Deno.makeTempDir();
  const executor = {
    buildTemplate(_s: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
      io.log("info", "[1] RUN false", "1");
      io.log("warn", "it broke", "1");
      return Promise.reject(
        new TemplateBuildError("1", "Step 1 failed: 'false' exited with code 1"),
      );
    },
  };
  const builds = new TemplateBuilds({ executor, dir });
  const record = builds.start(spec("b1"));
  await settled(record);
  const info = buildInfo(record, 1) as {
    status: string;
    logEntries: { message: string }[];
    reason: { step: string; message: string; logEntries: { message: string }[] };
  };
  assert.equal(info.status, "error");
  assert.deepEqual(info.logEntries.map((l) => l.message), ["it broke", info.reason.message]);
  assert.equal(info.reason.step, "1");
  assert.match(info.reason.message, /Step 1 failed/);
  assert.ok(info.reason.logEntries.some((l) => l.message === "it broke"));
  assert.throws(() => builds.get(record.spec.templateId, "b1", "t2"), (e: HttpError) => {
    assert.equal(e.status, 404);
    return true;
  });
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds ends a build past its time bound, naming the setting", async () => {
  const executor = heldBuilder();
  const dir = await Deno.makeTempDir();
  const builds = new TemplateBuilds({ executor, dir, timeoutMs: 1 });
  const record = builds.start(spec("b1"));
  await new Promise<void>((resolve) =>
    executor.waiting[0].io.signal.addEventListener("abort", () => resolve(), { once: true })
  );
  await settled(record);
  assert.equal(record.status, "error");
  assert.match(record.reason!.message, /DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS/);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds keeps a context within its cap and refuses a larger one with a 413", async () => {
  const dir = await Deno.makeTempDir();
  const builds = new TemplateBuilds({ executor: {}, dir, maxContextBytes: 4 });
  assert.equal(await builds.hasContext(HASH), false);
  await builds.putContext(HASH, new Blob([new Uint8Array(4)]).stream());
  assert.equal(await builds.hasContext(HASH), true);
  const other = "b".repeat(64);
  await assert.rejects(
    builds.putContext(other, new Blob([new Uint8Array(5)]).stream()),
    (e: HttpError) => e.status === 413 && /DORMICE_TEMPLATE_CONTEXT_LIMIT_MB/.test(e.message),
  );
  assert.equal(await builds.hasContext(other), false);
  assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), [HASH]);
  await assert.rejects(builds.hasContext("../x"), (e: HttpError) => e.status === 400);
  // An executor that builds nothing answers a 501.
  assert.throws(() => builds.start(spec("b1")), (e: HttpError) => e.status === 501);
  await Deno.remove(dir, { recursive: true });
});
