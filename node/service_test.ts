import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { HttpError } from "../shared/http_error.ts";
import { type ExecHandle, type ExecRequest, ExecutorError } from "./executors/contract.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { LedgerFullError } from "./ledger_space.ts";
import { SandboxService } from "./service.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function setup(options: { maxOutputBytes?: number } = {}) {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor({ clock });
  const service = new SandboxService({ ledger, executor, clock, ...options });
  const close = async () => {
    await executor.close();
    ledger.close();
  };
  return { clock, ledger, executor, service, close };
}

async function flush(): Promise<void> {
  for (let i = 0; i < 20; i++) await Promise.resolve();
}

Deno.test("SandboxService.lookup() finds a create in flight once it lands", async () => {
  const { executor, service, close } = setup();
  const release = executor.hooks.park("create");
  const creating = service.acquire({ name: "agent-1" });
  await executor.hooks.parked("create");
  let answer: unknown;
  const looking = service.lookup({ name: "agent-1" }).then((a) => answer = a);
  await flush();
  // Removing the wait on the busy slot makes this answer {found:false} here (reverse-proved).
  assert.equal(answer, undefined, "lookup must wait for the create, not answer absent");
  release();
  const { sandbox } = await creating;
  await looking;
  assert.deepEqual(answer, {
    found: true,
    sandbox: { id: sandbox.id, name: "agent-1", state: "active", team: "default" },
  });
  await close();
});

Deno.test("SandboxService.lookup(): a row answers at once, a free slot is a plain no", async () => {
  const { service, executor, close } = setup();
  const { sandbox } = await service.acquire({ name: "a" });
  await service.pause({ name: "a" });
  // A row answers at once even while another verb holds the slot.
  const release = executor.hooks.park("stats");
  const metrics = service.metrics({ name: "a" });
  await executor.hooks.parked("stats");
  assert.deepEqual(await service.lookup({ name: "a" }), {
    found: true,
    sandbox: { id: sandbox.id, name: "a", state: "frozen", team: "default" },
  });
  release();
  await metrics;
  assert.deepEqual(await service.lookup({ name: "b" }), { found: false });
  assert.deepEqual(await service.lookup({ id: sandbox.id }), {
    found: true,
    sandbox: { id: sandbox.id, name: "a", state: "frozen", team: "default" },
  });
  assert.deepEqual(await service.lookup({ id: "sbx_nope" }), { found: false });
  // Read-only: the lookups neither woke it nor touched its idle clock.
  assert.equal(service.get({ name: "a" })?.state, "frozen");
  await close();
});

Deno.test("SandboxService.lookup() after a failed create is a plain no", async () => {
  const { executor, service, close } = setup();
  const release = executor.hooks.park("create");
  executor.hooks.fail("create", new ExecutorError("unavailable", "Engine down"));
  const creating = service.acquire({ name: "a" });
  await executor.hooks.parked("create");
  const looking = service.lookup({ name: "a" });
  release();
  await assert.rejects(creating, (e) => e instanceof HttpError && e.status === 503);
  assert.deepEqual(await looking, { found: false });
  await close();
});

Deno.test("SandboxService.acquire(): twenty callers build one sandbox", async () => {
  const { executor, service, close } = setup();
  const results = await Promise.all(
    Array.from({ length: 20 }, () => service.acquire({ name: "same", metadata: { a: "1" } })),
  );
  assert.equal(executor.hooks.calls.create, 1);
  assert.equal(results.filter((r) => r.created).length, 1);
  assert.equal(new Set(results.map((r) => r.sandbox.id)).size, 1);
  await close();
});

Deno.test("SandboxService.acquire(): another template for an existing name is a 409 naming both; none or the same wakes it", async () => {
  const { executor, service, close } = setup();
  try {
    const built = await service.acquire({ name: "agent-1", template: "minimal" });
    assert.equal(built.sandbox.template, "minimal");
    await service.pause({ name: "agent-1" });
    const refused = await service.acquire({ name: "agent-1", template: "base" }).then(
      () => assert.fail("a base acquire woke the minimal sandbox"),
      (error) => error,
    );
    assert.ok(refused instanceof HttpError);
    assert.equal(refused.status, 409);
    assert.match(
      refused.message,
      /'agent-1' exists with template 'minimal'.*asks for template 'base'/,
    );
    assert.match(refused.message, /destroy it first \(destroySandbox/);
    assert.match(refused.message, /or use another name/);
    // Refused before anything was touched: still paused, nothing built.
    assert.equal(service.get({ name: "agent-1" })?.state, "frozen");
    assert.equal((await executor.list()).length, 1);
    for (const template of [undefined, "minimal"]) {
      const woken = await service.acquire({ name: "agent-1", template });
      assert.equal(woken.created, false);
      assert.equal(woken.sandbox.id, built.sandbox.id);
    }
  } finally {
    await close();
  }
});

Deno.test("SandboxService.acquire() removes the container when the ledger write fails", async () => {
  const { executor, ledger, service, close } = setup();
  const insert = ledger.insert.bind(ledger);
  ledger.insert = () => {
    throw new Error("disk full");
  };
  await assert.rejects(service.acquire({ name: "a" }), /could not record it.*disk full/);
  assert.deepEqual(await executor.list(), []);
  ledger.insert = insert;
  await close();
});

Deno.test("SandboxService wakes a frozen sandbox before exec and touches its idle clock", async () => {
  const { clock, service, close } = setup();
  await service.acquire({ name: "a", spec: { env: { X: "from-spec" } } });
  await service.pause({ name: "a" });
  await assert.rejects(
    service.pause({ name: "a" }),
    (e) => e instanceof HttpError && e.status === 409,
  );
  clock.tick(60_000);
  const r = await service.execCommand({ name: "a" }, {
    cmd: ["sh", "-c", "echo $X; echo e >&2; exit 3"],
  });
  assert.deepEqual(r, {
    exitCode: 3,
    stdout: "from-spec\n",
    stderr: "e\n",
    stdoutTruncated: false,
    stderrTruncated: false,
  });
  const after = service.get({ name: "a" })!;
  assert.equal(after.state, "active");
  assert.equal(after.lastActiveAt, new Date(1_700_000_060_000).toISOString());
  assert.deepEqual(await service.resume({ name: "a" }), { resumed: false, sandbox: after });
  await close();
});

Deno.test("SandboxService.execCommand() caps each stream and says so", async () => {
  const { service, close } = setup({ maxOutputBytes: 4 });
  await service.acquire({ name: "a" });
  const r = await service.execCommand({ name: "a" }, {
    cmd: ["bash", "-c", "echo 123456; echo ab >&2"],
  });
  assert.equal(r.stdout, "1234");
  assert.equal(r.stdoutTruncated, true);
  assert.equal(r.stderr, "ab\n");
  assert.equal(r.stderrTruncated, false);
  const timed = await service.execCommand({ name: "a" }, { cmd: ["sleep", "5"], timeoutMs: 1 });
  assert.equal(timed.timedOut, true);
  assert.equal(timed.exitCode, 137);
  await close();
});

Deno.test("SandboxService maps executor errors to statuses and unknown names to 404", async () => {
  const { service, close } = setup();
  await service.acquire({ name: "a" });
  const status = async (p: Promise<unknown>) => {
    try {
      await p;
    } catch (e) {
      assert.ok(e instanceof HttpError, String(e));
      return e.status;
    }
    assert.fail("expected an HttpError");
  };
  assert.equal(await status(service.readFile({ name: "a" }, "/nope")), 404);
  assert.equal(await status(service.readFile({ name: "a" }, "/tmp")), 400);
  assert.equal(await status(service.readFile({ name: "b" }, "/tmp")), 404);
  assert.equal(await status(service.metrics({ id: "sbx_nope" })), 404);
  await assert.rejects(
    service.readFile({ name: "b" }, "/x"),
    /No sandbox named 'b'.*acquireSandbox/,
  );
  await close();
});

Deno.test("SandboxService files, metadata, list, commands and destroy", async () => {
  const { service, close } = setup();
  const { sandbox } = await service.acquire({ name: "a", metadata: { team: "x" } });
  await service.acquire({ name: "b", metadata: { team: "y" } });
  const entry = await service.writeFile({ name: "a" }, "/tmp/f", encoder.encode("hello"));
  assert.equal(entry.size, 5);
  assert.equal(decoder.decode(await service.readFile({ id: sandbox.id }, "/tmp/f")), "hello");
  assert.equal(await service.makeDir({ name: "a" }, "/tmp/d"), true);
  assert.equal((await service.move({ name: "a" }, "/tmp/f", "/tmp/d/g")).path, "/tmp/d/g");
  assert.equal((await service.stat({ name: "a" }, "/tmp/d/g")).size, 5);
  assert.deepEqual((await service.listDir({ name: "a" }, "/tmp/d")).map((e) => e.name), ["g"]);
  await service.remove({ name: "a" }, "/tmp/d");
  const merged = await service.updateMetadata({ name: "a" }, { extra: "1" }, true);
  assert.deepEqual(merged.metadata, { team: "x", extra: "1" });
  const replaced = await service.updateMetadata({ name: "a" }, { only: "1" });
  assert.deepEqual(replaced.metadata, { only: "1" });
  assert.deepEqual(service.list({ metadata: { team: "y" } }).map((s) => s.name), ["b"]);
  assert.deepEqual(service.list({ states: ["frozen"] }), []);
  const handle = await service.startCommand({ name: "a" }, { cmd: ["sleep", "30"] });
  assert.deepEqual([...service.commands({ name: "a" }).keys()], [handle.pid]);
  assert.equal(await service.destroy({ name: "a" }), true);
  assert.equal((await handle.exited).signal, "SIGKILL");
  assert.equal(await service.destroy({ name: "a" }), false);
  assert.equal(await service.destroy({ id: "sbx_nope" }), false);
  assert.deepEqual(service.list().map((s) => s.name), ["b"]);
  await close();
});

Deno.test("SandboxService.expireIfDue() kills or pauses past the deadline only", async () => {
  const { clock, service, close } = setup();
  const { sandbox: k } = await service.acquire({
    name: "k",
    deadline: { ms: 1000, action: "kill" },
  });
  const { sandbox: p } = await service.acquire({
    name: "p",
    deadline: { ms: 1000, action: "pause" },
  });
  assert.equal(await service.expireIfDue(k.id), "skipped");
  clock.tick(1000);
  assert.equal(await service.expireIfDue(k.id), "killed");
  assert.equal(await service.expireIfDue(p.id), "paused");
  const paused = service.get({ name: "p" })!;
  assert.equal(paused.state, "frozen");
  assert.equal(paused.deadlineAt, null);
  assert.equal(service.get({ name: "k" }), undefined);
  assert.equal(service.setDeadline({ name: "p" }, 5, "kill").deadlineAt, 5);
  await close();
});

/**
 * A fake whose sandboxes in `older` stand for containers from before instance labels: `list()`
 * leaves them out and `legacy()` names them, as the Docker executor does.
 */
class LegacyFake extends FakeExecutor {
  older = new Set<string>();
  override async list(): Promise<string[]> {
    return (await super.list()).filter((id) => !this.older.has(id));
  }
  async legacy(): Promise<string[]> {
    return (await super.list()).filter((id) => this.older.has(id));
  }
}

Deno.test("SandboxService.reconcile() adopts older sandboxes it knows and never removes the others", async () => {
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new LegacyFake();
  const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  const service = new SandboxService({
    ledger,
    executor,
    log: (level, msg, fields) => lines.push({ level, msg, fields }),
  });
  const { sandbox: mine } = await service.acquire({ name: "mine" });
  const spec = { id: "", name: "x", template: "base", spec: {}, env: {} };
  await executor.create({ ...spec, id: "sbx_another_fleets" });
  await executor.create({ ...spec, id: "sbx_my_orphan" });
  executor.older.add(mine.id).add("sbx_another_fleets");

  const result = await service.reconcile();
  assert.deepEqual(result, { lost: [], removed: ["sbx_my_orphan"] });
  // Without the legacy adoption the row would be marked lost; without the rule that only made
  // sandboxes are removed, the other fleet's would be gone.
  assert.equal(ledger.byId(mine.id)!.state, "active");
  assert.deepEqual((await executor.legacy()).sort(), [mine.id, "sbx_another_fleets"].sort());
  assert.ok(lines.some((l) => /left alone/.test(l.msg) && l.fields?.count === 1), "said so");
  await executor.close();
  ledger.close();
});

Deno.test("SandboxService.reconcile() marks lost rows stopped and removes orphans", async () => {
  const { executor, ledger, service, close } = setup();
  const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  const logged = new SandboxService({
    ledger,
    executor,
    queue: service.queue,
    log: (level, msg, fields) => lines.push({ level, msg, fields }),
  });
  const { sandbox: kept } = await service.acquire({ name: "kept" });
  const { sandbox: lost } = await service.acquire({ name: "lost" });
  const { sandbox: lostPausing } = await service.acquire({
    name: "lost-pausing",
    deadline: { ms: 60_000, action: "pause" },
  });
  const { sandbox: lostKilling } = await service.acquire({
    name: "lost-killing",
    deadline: { ms: 60_000, action: "kill" },
  });
  await service.pause({ name: "lost" });
  for (const s of [lost, lostPausing, lostKilling]) await executor.destroy(s.id);
  await executor.create({ id: "sbx_orphan", name: "o", template: "base", spec: {}, env: {} });

  const first = await logged.reconcile();
  assert.deepEqual(first.lost.sort(), [lost.id, lostPausing.id, lostKilling.id].sort());
  assert.deepEqual(first.removed, ["sbx_orphan"]);
  // Never dropped: every row is still there, the lost ones stopped.
  assert.deepEqual(
    Object.fromEntries(ledger.all().map((s) => [s.name, s.state])),
    { kept: "active", lost: "stopped", "lost-pausing": "stopped", "lost-killing": "stopped" },
  );
  // Nothing left to pause; a kill deadline still cleans the row up at its time.
  assert.equal(ledger.byId(lostPausing.id)!.deadlineAt, null);
  assert.equal(ledger.byId(lostKilling.id)!.deadlineAction, "kill");
  assert.deepEqual(await executor.list(), [kept.id]);
  // Reported, by name and id, with what it was before.
  const reports = lines.filter((l) => /sandbox lost/.test(l.msg));
  assert.equal(reports.length, 3);
  assert.ok(reports.every((l) => l.level === "warn"));
  assert.deepEqual(reports.find((l) => l.fields?.name === "lost")?.fields, {
    name: "lost",
    id: lost.id,
    was: "frozen",
    executor: "fake",
  });
  assert.ok(
    lines.some((l) => /without a ledger row removed/.test(l.msg) && l.fields?.id === "sbx_orphan"),
  );

  // A second boot reports the same rows again and removes nothing.
  assert.deepEqual((await logged.reconcile()).removed, []);

  // A wake of a lost sandbox says what happened instead of a bare 404; destroy still works.
  await assert.rejects(service.execCommand({ name: "lost" }, { cmd: ["true"] }), (e: unknown) => {
    assert.ok(e instanceof HttpError);
    assert.equal(e.status, 410);
    assert.match(e.message, /Sandbox 'lost' lost its fake sandbox.*destroy it/);
    return true;
  });
  await assert.rejects(
    service.acquire({ name: "lost" }),
    (e: unknown) => e instanceof HttpError && e.status === 410,
  );
  assert.equal(await service.destroy({ name: "lost" }), true);
  assert.equal((await service.acquire({ name: "lost" })).created, true);
  await close();
});

Deno.test("SandboxService: a destroy waits for a verb holding the name's slot", async () => {
  const { executor, service, close } = setup();
  await service.acquire({ name: "a" });
  const release = executor.hooks.park("writeFile");
  const writing = service.writeFile({ name: "a" }, "/tmp/f", encoder.encode("x"));
  await executor.hooks.parked("writeFile");
  const destroying = service.destroy({ name: "a" });
  await flush();
  assert.equal(executor.hooks.calls.destroy, 0, "destroy must queue behind the write");
  release();
  assert.equal((await writing).size, 1);
  assert.equal(await destroying, true);
  await close();
});

Deno.test("SandboxService: a long command holds no slot, so destroy ends it with a 410", async () => {
  const { service, close } = setup();
  await service.acquire({ name: "a" });
  const running = service.execCommand({ name: "a" }, {
    cmd: ["bash", "-c", "echo started; sleep 30"],
  });
  await flush();
  assert.equal(await service.destroy({ name: "a" }), true);
  // Not the kill's 137, which would read as the command's own exit (an OOM kill, say).
  await assert.rejects(running, (e: HttpError) => {
    assert.equal(e.status, 410);
    assert.match(e.message, /'a' was destroyed while the command ran/);
    return true;
  });
  await close();
});

Deno.test("SandboxService keeps teams apart: one name per team, ids scoped to their team", async () => {
  const { service, close } = setup();
  const a = await service.acquire({ name: "agent-1", team: "a" });
  const b = await service.acquire({ name: "agent-1", team: "b" });
  assert.equal(a.created && b.created, true, "two teams' agent-1 are two sandboxes");
  assert.notEqual(a.sandbox.id, b.sandbox.id);
  assert.equal(service.get({ id: a.sandbox.id, team: "b" }), undefined);
  assert.equal(service.get({ id: a.sandbox.id })?.team, "a", "no team: the operator sees all");
  assert.deepEqual(await service.lookup({ id: a.sandbox.id }, "b"), { found: false });
  assert.deepEqual(await service.lookup({ name: "agent-1" }, "b"), {
    found: true,
    sandbox: { id: b.sandbox.id, name: "agent-1", state: "active", team: "b" },
  });
  assert.deepEqual(service.list({ team: "a" }).map((s) => s.id), [a.sandbox.id]);
  assert.equal(service.list().length, 2);
  await assert.rejects(
    () => service.execCommand({ id: a.sandbox.id, team: "b" }, { cmd: ["true"] }),
    (e) => e instanceof HttpError && e.status === 404,
  );
  assert.equal(await service.destroy({ id: a.sandbox.id, team: "b" }), false);
  assert.equal(await service.destroy({ name: "agent-1", team: "a" }), true);
  assert.equal(service.get({ name: "agent-1", team: "b" })?.id, b.sandbox.id);
  await close();
});

Deno.test("SandboxService on a full ledger: commands need no write, a wake or pause is undone", async () => {
  const { clock, ledger, executor, service, close } = setup();
  try {
    await service.acquire({ name: "busy" });
    await service.acquire({ name: "napper" });
    await service.pause({ name: "napper" });
    // From here every row write is refused for want of space.
    const full = () => {
      throw new LedgerFullError("/data", "a change");
    };
    ledger.update = full;
    ledger.insert = full;
    clock.tick(5_000);
    const ran = await service.execCommand({ name: "busy" }, { cmd: ["echo", "ok"] });
    assert.equal(ran.stdout, "ok\n");
    assert.equal(service.get({ name: "busy" })?.lastActiveAt, new Date(clock.now()).toISOString());

    const woken = await service.execCommand({ name: "napper" }, { cmd: ["true"] }).catch((e) => e);
    assert.ok(woken instanceof LedgerFullError, String(woken));
    assert.equal(service.get({ name: "napper" })?.state, "frozen");
    assert.equal(executor.hooks.calls.pause, 2, "the sandbox woken without its write sleeps again");

    const paused = await service.pause({ name: "busy" }).catch((e) => e);
    assert.ok(paused instanceof LedgerFullError, String(paused));
    assert.equal(executor.hooks.calls.resume, 2, "the sandbox paused without its write runs again");
    assert.equal(
      (await service.execCommand({ name: "busy" }, { cmd: ["echo", "up"] })).stdout,
      "up\n",
    );
  } finally {
    await close();
  }
});

Deno.test("SandboxService notices a sandbox removed behind its back: row stopped, 410 on every use", async () => {
  const { ledger, executor, service, close } = setup();
  try {
    const { sandbox } = await service.acquire({ name: "a" });
    await executor.destroy(sandbox.id); // as `docker rm -f` would
    for (
      const use of [
        () => service.acquire({ name: "a" }),
        () => service.execCommand({ name: "a" }, { cmd: ["true"] }),
        () => service.readFile({ name: "a" }, "/tmp/x"),
        () => service.resume({ name: "a" }),
      ]
    ) {
      await assert.rejects(use(), (e: unknown) => {
        assert.ok(e instanceof HttpError, String(e));
        assert.equal(e.status, 410);
        assert.match(e.message, /^Sandbox 'a' lost its fake sandbox, with its files and processes/);
        return true;
      });
    }
    assert.equal(ledger.byName("a")?.state, "stopped");
    assert.equal(await service.destroy({ name: "a" }), true);
    assert.equal((await service.acquire({ name: "a" })).created, true);
  } finally {
    await close();
  }
});

Deno.test("SandboxService: every 410 of a lost sandbox names its own cause, not the boot's", async () => {
  const { ledger, executor, service, close } = setup();
  try {
    const { sandbox: removed } = await service.acquire({ name: "removed" });
    const { sandbox: missing } = await service.acquire({ name: "missing" });
    // Gone before a boot: the reconcile finds it missing.
    await executor.destroy(missing.id);
    assert.deepEqual((await service.reconcile()).lost, [missing.id]);
    // Gone while the node runs, as `docker rm -f` would do it.
    await executor.destroy(removed.id);
    const causeOf = async (name: string) => {
      const e = await service.execCommand({ name }, { cmd: ["true"] }).then(
        () => assert.fail(`'${name}' answered`),
        (e: unknown) => e,
      );
      assert.ok(e instanceof HttpError && e.status === 410, String(e));
      return /with its files and processes \((.*)\): destroy it/.exec(e.message)?.[1];
    };
    for (const call of [1, 2, 3]) {
      assert.equal(
        await causeOf("removed"),
        `the fake executor has no sandbox with id '${removed.id}'`,
        `call ${call} of the sandbox removed while the node ran`,
      );
      assert.equal(
        await causeOf("missing"),
        "it was missing when the node started",
        `call ${call} of the sandbox missing at boot`,
      );
    }
    assert.equal(ledger.byName("removed")?.state, "stopped");
    assert.equal(await service.destroy({ name: "missing" }), true);
    assert.equal(await service.destroy({ name: "removed" }), true);
  } finally {
    await close();
  }
});

Deno.test("SandboxService.execCommand(): output held open past the kill is answered anyway", async () => {
  /** A command that escapes its kill (say it dropped the executor's marker from its env). */
  class Escaping extends FakeExecutor {
    override async exec(id: string, request: ExecRequest): Promise<ExecHandle> {
      const { timeoutMs: _escaped, ...rest } = request;
      const h = await super.exec(id, rest);
      let ended = false;
      h.exited.finally(() => ended = true).catch(() => {});
      // The command's stdout, noting whether the service let go of it while the command ran.
      const out = h.stdout.getReader();
      const stdout = new ReadableStream<Uint8Array>({
        async pull(c) {
          const { done, value } = await out.read();
          if (done) c.close();
          else c.enqueue(value);
        },
        cancel(reason) {
          letGoWhileRunning = !ended;
          return out.cancel(reason);
        },
      });
      return {
        pid: h.pid,
        stdout,
        stderr: h.stderr,
        exited: h.exited,
        writeStdin: (d) => h.writeStdin(d),
        closeStdin: () => h.closeStdin(),
        kill: () => Promise.resolve(),
        resize: (s) => h.resize(s),
      };
    }
  }
  /** Whether the service stopped reading the command's stdout while the command still ran. */
  let letGoWhileRunning = false;
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new Escaping();
  const service = new SandboxService({ ledger, executor, killGraceMs: 100 });
  await service.acquire({ name: "a" });
  const r = await service.execCommand({ name: "a" }, {
    cmd: ["bash", "-c", "echo started; sleep 30"],
    timeoutMs: 100,
  });
  // The service let go of the output while the escaped command still held it open: the answer
  // did not wait for the command's end (30 s away).
  assert.equal(letGoWhileRunning, true, "execCommand waited for the escaped command's output");
  assert.deepEqual(r, {
    exitCode: -1,
    stdout: "started\n",
    stderr: "",
    stdoutTruncated: false,
    stderrTruncated: false,
    timedOut: true,
  });
  await executor.close();
  ledger.close();
});

Deno.test("SandboxService: an exit lost to a destroy still reads as the destroy (410)", async () => {
  /** Docker's case: the exec vanished with its container before its exit code was read. */
  class Losing extends FakeExecutor {
    override async exec(id: string, request: ExecRequest): Promise<ExecHandle> {
      const h = await super.exec(id, request);
      return {
        pid: h.pid,
        stdout: h.stdout,
        stderr: h.stderr,
        exited: h.exited.then((exit) =>
          exit.signal
            ? Promise.reject(new ExecutorError("unavailable", "Lost the Docker engine"))
            : exit
        ),
        writeStdin: (d) => h.writeStdin(d),
        closeStdin: () => h.closeStdin(),
        kill: (signal) => h.kill(signal),
        resize: (s) => h.resize(s),
      };
    }
  }
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new Losing();
  const service = new SandboxService({ ledger, executor });
  await service.acquire({ name: "a" });
  const running = service.execCommand({ name: "a" }, { cmd: ["bash", "-c", "sleep 30"] });
  await flush();
  assert.equal(await service.destroy({ name: "a" }), true);
  await assert.rejects(running, (e: HttpError) => e.status === 410);
  await executor.close();
  ledger.close();
});

Deno.test("SandboxService: a sandbox paused to disk keeps its row through reconcile, and wakes on use", async () => {
  const { ledger, service, close } = setup();
  try {
    const { sandbox } = await service.acquire({ name: "to-disk" });
    await service.writeFile({ name: "to-disk" }, "/tmp/a.txt", encoder.encode("kept"));
    const paused = await service.pause({ name: "to-disk" }, { keepMemory: false });
    assert.equal(paused.state, "archived");
    await assert.rejects(service.pause({ name: "to-disk" }), /already paused/);
    // Held by the executor (its files), so the boot reconcile neither marks nor removes it.
    assert.deepEqual(await service.reconcile(), { lost: [], removed: [] });
    assert.equal(ledger.byId(sandbox.id)!.state, "archived");
    // A native verb wakes it, as it wakes a frozen one: restored with its files.
    const r = await service.execCommand({ name: "to-disk" }, { cmd: ["cat", "/tmp/a.txt"] });
    assert.equal(r.stdout, "kept");
    assert.equal(ledger.byId(sandbox.id)!.state, "active");
    // Paused to disk again, then the executor loses what it kept (a fake node's restart).
    await service.pause({ name: "to-disk" }, { keepMemory: false });
    const restarted = new SandboxService({ ledger, executor: new FakeExecutor() });
    assert.deepEqual((await restarted.reconcile()).lost, [sandbox.id]);
    await assert.rejects(
      restarted.resume({ name: "to-disk" }),
      (e) => e instanceof HttpError && e.status === 410,
    );
    assert.equal(await restarted.destroy({ name: "to-disk" }), true);
  } finally {
    await close();
  }
});

Deno.test("a direct create is announced with its slot busy before the build and again after", async () => {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor({ clock });
  const seen: { busy: string[]; row: boolean }[] = [];
  let refuse = false;
  const service: SandboxService = new SandboxService({
    ledger,
    executor,
    clock,
    announceDirect: (what) => {
      seen.push({ busy: [...service.queue.busyKeys()], row: ledger.byName("a") !== undefined });
      if (refuse) return Promise.reject(new Error(`cannot announce ${what}`));
      return Promise.resolve();
    },
  });
  try {
    await service.acquire({ name: "a", direct: true });
    assert.deepEqual(seen, [{ busy: ["a"], row: false }, { busy: ["a"], row: true }]);
    // A create through a gateway, or a wake, announces nothing.
    await service.acquire({ name: "b" });
    await service.acquire({ name: "a", direct: true });
    assert.equal(seen.length, 2);
    // A refused announcement builds nothing.
    refuse = true;
    await assert.rejects(service.acquire({ name: "c", direct: true }), /cannot announce/);
    assert.equal(ledger.byName("c"), undefined);
    assert.equal(executor.hooks.calls.create, 2);
  } finally {
    await executor.close();
    ledger.close();
  }
});
