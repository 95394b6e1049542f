import assert from "node:assert/strict";
import type { HttpError } from "../shared/http_error.ts";
import type { SnapshotInfo } from "./executors/contract.ts";
import {
  type BuildIo,
  TemplateBuildError,
  type TemplateBuildSpec,
} from "./executors/template_build.ts";
import {
  buildInfo,
  type BuildRecord,
  KEPT_LOG_CHARS,
  KEPT_RESERVATIONS,
  LOG_LINE_CHARS,
  TemplateBuilds,
} from "./templates_build.ts";

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
  assert.equal(await builds.hasContext(HASH, "t1"), false);
  await builds.putContext(HASH, "t1", new Blob([new Uint8Array(4)]).stream());
  assert.equal(await builds.hasContext(HASH, "t1"), true);
  const other = "b".repeat(64);
  await assert.rejects(
    builds.putContext(other, "t1", new Blob([new Uint8Array(5)]).stream()),
    (e: HttpError) => e.status === 413 && /DORMICE_TEMPLATE_CONTEXT_LIMIT_MB/.test(e.message),
  );
  assert.equal(await builds.hasContext(other, "t1"), false);
  assert.deepEqual([...Deno.readDirSync(`${dir}/t1`)].map((e) => e.name), [HASH]);
  await assert.rejects(builds.hasContext("../x", "t1"), (e: HttpError) => e.status === 400);
  // An executor that builds nothing answers a 501.
  assert.throws(() => builds.start(spec("b1")), (e: HttpError) => e.status === 501);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds keeps each team's contexts apart: an upload under a hash never stands for another team's files", async () => {
  const dir = await Deno.makeTempDir();
  const seen: (string | undefined)[] = [];
  const executor = {
    buildTemplate(s: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
      seen.push(io.contextFile(HASH));
      return Promise.reject(new TemplateBuildError("1", `no files for ${s.team}`));
    },
  };
  const builds = new TemplateBuilds({ executor, dir });
  // Team "evil" uploads its own bytes under the hash team "t1"'s files will have.
  await builds.putContext(HASH, "evil", new Blob([new Uint8Array(1024)]).stream());
  assert.equal(await builds.hasContext(HASH, "evil"), true);
  assert.equal(await builds.hasContext(HASH, "t1"), false);
  const record = builds.start(spec("b1", "t1"));
  await settled(record);
  assert.deepEqual(seen, [undefined]);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds refuses a context whose entries leave it, and keeps nothing of it", async () => {
  const dir = await Deno.makeTempDir();
  const builds = new TemplateBuilds({ executor: {}, dir });
  const header = new Uint8Array(1024 + 512);
  header.set(new TextEncoder().encode("../../etc/passwd"), 0);
  header.set(new TextEncoder().encode("00000000000\0"), 124);
  header[156] = "0".charCodeAt(0);
  await assert.rejects(
    builds.putContext(HASH, "t1", new Blob([header]).stream()),
    (e: HttpError) => e.status === 400 && /leaves the context/.test(e.message),
  );
  assert.equal(await builds.hasContext(HASH, "t1"), false);
  assert.deepEqual([...Deno.readDirSync(`${dir}/t1`)], []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds caps a build's log lines in length and in total, and keeps its last line", async () => {
  const dir = await Deno.makeTempDir();
  const executor = {
    buildTemplate(_s: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
      io.log("info", "x".repeat(10 * LOG_LINE_CHARS), "1");
      for (let i = 0; i < 2000; i++) io.log("info", "y".repeat(LOG_LINE_CHARS), "1");
      return Promise.reject(new TemplateBuildError("1", "step 1 failed"));
    },
  };
  const builds = new TemplateBuilds({ executor, dir });
  const record = builds.start(spec("b1"));
  await settled(record);
  assert.ok(record.logs.every((l) => l.message.length <= LOG_LINE_CHARS + 100));
  const total = record.logs.reduce((n, l) => n + l.message.length, 0);
  assert.ok(total <= KEPT_LOG_CHARS + 2 * LOG_LINE_CHARS, `${total} characters kept`);
  assert.ok(record.dropped > 0);
  assert.equal(record.logs.at(-1)!.message, "step 1 failed");
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds refuses a COPY from outside the uploaded files with a 400 naming the step", () => {
  const builds = new TemplateBuilds({ executor: heldBuilder(), dir: "/nonexistent" });
  for (const src of ["../../etc", "/etc/passwd", "a/../../b", "ok.txt ../x"]) {
    const s = {
      ...spec("b1"),
      steps: [{ type: "RUN", args: ["true"] }, {
        type: "COPY",
        args: [src, "/app"],
        filesHash: HASH,
      }],
    };
    assert.throws(() => builds.start(s), (e: HttpError) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /^Step 2 copies '.*', which is outside the uploaded files/);
      return true;
    });
  }
  assert.equal(builds.running, 0);
});

Deno.test("TemplateBuilds pushes a finished template to the registry before it is ready", async () => {
  const dir = await Deno.makeTempDir();
  const executor = heldBuilder();
  const told: string[] = [];
  const builds = new TemplateBuilds({
    executor,
    dir,
    snapshots: {
      refresh: () => Promise.resolve(void told.push("refresh")),
      push: (id) => Promise.resolve(void told.push(`push ${id}`)),
    },
  });
  const record = builds.start(spec("b1"));
  executor.waiting[0].resolve();
  await settled(record);
  assert.equal(record.status, "ready");
  assert.deepEqual(told, [`push ${spec("b1").templateId}`, "refresh"]);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds pushes a check-in advertising a finished template before it reads ready", async () => {
  const dir = await Deno.makeTempDir();
  const executor = heldBuilder();
  const told: string[] = [];
  const held: { record?: ReturnType<TemplateBuilds["start"]> } = {};
  const builds = new TemplateBuilds({
    executor,
    dir,
    snapshots: { refresh: () => Promise.resolve(void told.push("refresh")) },
    announce: (id) => Promise.resolve(void told.push(`announce ${id} (${held.record?.status})`)),
  });
  const record = builds.start(spec("b1"));
  held.record = record;
  executor.waiting[0].resolve();
  await settled(record);
  assert.equal(record.status, "ready");
  assert.deepEqual(told, ["refresh", `announce ${spec("b1").templateId} (building)`]);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("TemplateBuilds: a placed build is found by any gateway, its upload spent once it starts", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const executor = heldBuilder();
    const builds = new TemplateBuilds({ executor, dir });
    const id = "snap-aaaaaaaaaaaaaaaaaaaa";
    assert.equal(builds.uploadRefusal(id, "b1", "t1"), "its build is unknown or was forgotten");
    builds.reserve({ templateId: id, buildId: "b1", team: "t1", name: "tpl", cpus: 2 });
    builds.reserve({ templateId: id, buildId: "b2", team: "t1", name: "tpl" });
    assert.equal(builds.pending(id, "t1")?.buildId, "b2", "the newest not started");
    assert.equal(builds.pending(id, "t1", "b1")?.cpus, 2);
    assert.equal(builds.pending(id, "t2"), undefined, "another team's is not found");
    assert.equal(builds.pending(id, "t2", "b1"), undefined);
    assert.equal(builds.uploadRefusal(id, "b1", "t2"), "its build is unknown or was forgotten");
    assert.throws(
      () => builds.reserve({ templateId: id, buildId: "b1", team: "t2", name: "x" }),
      /another team's/,
    );
    builds.start(spec("b2"));
    assert.equal(builds.pending(id, "t1")?.buildId, "b1", "b2 started");
    assert.equal(builds.uploadRefusal(id, "b2", "t1"), undefined, "b1 has not sent its steps");
    assert.equal(builds.spend(id, "b1", "t1"), true, "b1 moved to another node");
    assert.equal(builds.spend(id, "b1", "t2"), false);
    assert.equal(builds.uploadRefusal(id, "b1", "t1"), "its build has started");
    assert.equal(builds.pending(id, "t1")?.buildId, "b2", "every one started: the newest");
    for (let i = 0; i < KEPT_RESERVATIONS; i++) {
      builds.reserve({ templateId: id, buildId: `x${i}`, team: "t1", name: "tpl" });
    }
    assert.equal(builds.pending(id, "t1", "b1"), undefined, "the oldest forgotten past the bound");
    for (const w of executor.waiting) w.resolve();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
