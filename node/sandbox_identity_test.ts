import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { WarmPools } from "./pools.ts";
import type { SandboxRef } from "./service_contract.ts";
import { SandboxService } from "./service.ts";
import { IDENTITY_SCRIPT, identityEnv } from "./sandbox_identity.ts";

const NAMES = ["E2B_SANDBOX", "E2B_SANDBOX_ID", "E2B_TEMPLATE_ID", "E2B_TEAM_ID"];

function setup(executor = new FakeExecutor()) {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const service = new SandboxService({ ledger, executor, clock });
  return { clock, ledger, executor, service };
}

/** What a command in the sandbox sees: each variable, and each file, as `name=value` lines. */
async function seen(service: SandboxService, ref: SandboxRef, env?: Record<string, string>) {
  const vars = NAMES.map((n) => `echo "${n}=$${n}"`).join(" && ");
  const fromEnv = await service.execCommand(ref, { cmd: ["sh", "-c", vars], env });
  const fromFiles = await Promise.all(
    NAMES.map((n) => service.execCommand(ref, { cmd: ["cat", `/run/e2b/.${n}`] })),
  );
  return {
    env: Object.fromEntries(
      fromEnv.stdout.trim().split("\n").map((
        l,
      ) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
    ),
    files: Object.fromEntries(NAMES.map((n, i) => [n, fromFiles[i].stdout])),
  };
}

function expected(id: string, template = "base", team = "default") {
  return { E2B_SANDBOX: "true", E2B_SANDBOX_ID: id, E2B_TEMPLATE_ID: template, E2B_TEAM_ID: team };
}

Deno.test("identityEnv() names the four variables envd sets; the script writes each as a file", () => {
  assert.deepEqual(Object.keys(identityEnv({ id: "i", template: "t", team: "x" })), NAMES);
  for (const n of NAMES) assert.ok(IDENTITY_SCRIPT.includes(`"$${n}" > /run/e2b/.${n}`));
});

Deno.test("a new sandbox: every command sees its identity, and /run/e2b holds it", async () => {
  const { service, executor } = setup();
  try {
    const { sandbox } = await service.acquire({ name: "a", team: "acme", template: "base" });
    const got = await seen(service, { id: sandbox.id });
    assert.deepEqual(got.env, expected(sandbox.id, "base", "acme"));
    assert.deepEqual(got.files, expected(sandbox.id, "base", "acme"));
    // A streamed command (E2B's commands and PTY) sees them too.
    const h = await service.startCommand({ id: sandbox.id }, {
      cmd: ["sh", "-c", 'echo "$E2B_SANDBOX_ID"'],
    });
    const [out] = await Promise.all([new Response(h.stdout).text(), h.exited]);
    assert.equal(out.trim(), sandbox.id);
  } finally {
    await executor.close();
  }
});

Deno.test("the create's env cannot replace the identity; a command's own env can", async () => {
  const { service, executor } = setup();
  try {
    const { sandbox } = await service.acquire({
      name: "a",
      env: { E2B_SANDBOX_ID: "mine", E2B_SANDBOX: "false", OTHER: "kept" },
    });
    const got = await seen(service, { id: sandbox.id });
    assert.equal(got.env.E2B_SANDBOX_ID, sandbox.id);
    assert.equal(got.env.E2B_SANDBOX, "true");
    const other = await service.execCommand({ id: sandbox.id }, {
      cmd: ["sh", "-c", "echo $OTHER"],
    });
    assert.equal(other.stdout, "kept\n");
    const own = await seen(service, { id: sandbox.id }, { E2B_SANDBOX_ID: "per-command" });
    assert.equal(own.env.E2B_SANDBOX_ID, "per-command");
    assert.equal(own.files.E2B_SANDBOX_ID, sandbox.id);
  } finally {
    await executor.close();
  }
});

Deno.test("a sandbox from a snapshot (a fork) has its own id, not its origin's", async () => {
  const { service, executor } = setup();
  try {
    const { sandbox: origin } = await service.acquire({ name: "origin", team: "acme" });
    const snap = await executor.snapshot(origin.id, { team: "acme" });
    const { sandbox: copy } = await service.acquire({
      name: "copy",
      team: "acme",
      snapshot: snap.snapshotId,
    });
    assert.notEqual(copy.id, origin.id);
    const got = await seen(service, { id: copy.id });
    assert.deepEqual(got.env, expected(copy.id, copy.template, "acme"));
    assert.deepEqual(got.files, expected(copy.id, copy.template, "acme"));
    assert.equal((await seen(service, { id: origin.id })).files.E2B_SANDBOX_ID, origin.id);
  } finally {
    await executor.close();
  }
});

Deno.test("paused to disk and resumed, here or taken over by another node: the same id", async () => {
  const { service, executor, clock } = setup();
  try {
    const { sandbox } = await service.acquire({ name: "a", team: "acme" });
    await service.pause({ id: sandbox.id }, { keepMemory: false });
    await service.resume({ id: sandbox.id });
    assert.deepEqual(
      (await seen(service, { id: sandbox.id })).files,
      expected(sandbox.id, "base", "acme"),
    );
    // Paused again, and adopted by another node's ledger (the executor holds its files).
    await service.pause({ id: sandbox.id }, { keepMemory: false });
    const record = service.get({ id: sandbox.id })!;
    const other = new SandboxService({
      ledger: Ledger.inMemory({ nodeId: "node-2", endpoint: "http://127.0.0.1:3677" }),
      executor,
      clock,
    });
    await other.adoptArchived(record);
    await other.resume({ id: sandbox.id });
    const got = await seen(other, { id: sandbox.id });
    assert.deepEqual(got.env, expected(sandbox.id, "base", "acme"));
    assert.deepEqual(got.files, expected(sandbox.id, "base", "acme"));
  } finally {
    await executor.close();
  }
});

Deno.test("a warm sandbox handed out: the id it is answered with, and its new team", async () => {
  const executor = new FakeExecutor();
  const clock = new FakeClock();
  const ledger = Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:3676" });
  const pools = new WarmPools({
    ledger,
    executor,
    clock,
    setTimer: () => {},
    claimRefillDelayMs: 0,
  });
  const service = new SandboxService({ ledger, executor, clock, pools });
  try {
    await pools.start();
    await pools.set([{ template: "base", spec: {}, warm: 1 }]);
    await pools.settled();
    const warmId = ledger.warmRows()[0].id;
    const { sandbox } = await service.acquire({ name: "a", team: "acme", template: "base" });
    assert.equal(sandbox.id, warmId, "precondition: the sandbox came from the pool");
    const got = await seen(service, { id: sandbox.id });
    assert.deepEqual(got.env, expected(sandbox.id, "base", "acme"));
    assert.deepEqual(got.files, expected(sandbox.id, "base", "acme"));
  } finally {
    await pools.close();
    await executor.close();
  }
});
