/**
 * Black-box exam of the node: real `node/main.ts` processes on the fake executor, spoken to with
 * fetch only.
 */
import assert from "node:assert/strict";
import { checkInSchema, lookupAnswerSchema } from "../shared/schemas.ts";
import { nativeVerbs } from "../node/faces/native.ts";
import {
  freePort,
  newToken,
  nodeMain,
  nodePermissions,
  spawnDeno,
  startNode,
} from "./_processes.ts";

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

async function post(
  url: string,
  verb: string,
  { body = {}, raw, token, method = "POST" }: {
    body?: unknown;
    raw?: string;
    token?: string | null;
    method?: string;
  },
): Promise<Answer> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const res = await fetch(`${url}/${verb}`, {
    method,
    headers,
    body: method === "GET" ? undefined : raw ?? JSON.stringify(body),
  });
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) };
  } catch {
    throw new Error(`${method} /${verb} answered ${res.status} with a non-JSON body: ${text}`);
  }
}

/** The body is exactly `{message}` and the message reads as a sentence. */
function assertSentence(answer: Answer, label: string): void {
  assert.deepEqual(
    Object.keys(answer.body),
    ["message"],
    `${label}: ${JSON.stringify(answer.body)}`,
  );
  const message = answer.body.message;
  assert.equal(typeof message, "string", label);
  assert.ok((message as string).split(" ").length >= 4, `${label}: too short: ${message}`);
  assert.doesNotMatch(message as string, /undefined|\[object Object\]/, label);
}

Deno.test("node process: every verb round-trips over HTTP and SIGTERM stops it cleanly", async () => {
  const node = await startNode();
  try {
    const { url, token } = node;
    const call = (verb: string, body: unknown) => post(url, verb, { body, token });
    const acquired = await call("acquireSandbox", { name: "agent-1", metadata: { team: "a" } });
    assert.equal(acquired.status, 200);
    assert.equal(acquired.body.status, "ready");
    assert.equal(acquired.body.created, true);
    const sandbox = acquired.body.sandbox as Record<string, unknown>;
    assert.deepEqual(Object.keys(sandbox).sort(), [
      "createdAt",
      "endpoint",
      "id",
      "lastActiveAt",
      "metadata",
      "name",
      "nodeId",
      "spec",
      "state",
      "team",
      "template",
    ]);
    assert.equal(sandbox.endpoint, url);
    assert.equal(sandbox.nodeId, "node-1");
    assert.equal((await call("acquireSandbox", { name: "agent-1" })).body.created, false);

    const exec = await call("execCommand", {
      name: "agent-1",
      command: "echo a; sleep 0.01; echo b >&2; exit 3",
    });
    assert.deepEqual(exec.body, {
      exitCode: 3,
      stdout: "a\n",
      stderr: "b\n",
      stdoutTruncated: false,
      stderrTruncated: false,
    });
    const timed = await call("execCommand", {
      name: "agent-1",
      command: "sleep 30",
      timeoutSeconds: 0.05,
    });
    assert.equal(timed.body.timedOut, true);

    assert.deepEqual(
      (await call("writeFile", { name: "agent-1", path: "/tmp/x", contentBase64: "aGk=" })).body,
      {
        path: "/tmp/x",
        size: 2,
      },
    );
    assert.deepEqual((await call("readFile", { name: "agent-1", path: "/tmp/x" })).body, {
      path: "/tmp/x",
      size: 2,
      contentBase64: "aGk=",
    });
    const meta = await call("updateMetadata", { name: "agent-1", metadata: { team: "b" } });
    assert.deepEqual((meta.body.sandbox as { metadata: unknown }).metadata, { team: "b" });
    const list = await call("listSandboxes", {});
    assert.deepEqual((list.body.sandboxes as { name: string }[]).map((s) => s.name), ["agent-1"]);
    const metrics = await call("getSandboxMetrics", { name: "agent-1" });
    assert.equal(metrics.status, 200);
    const host = await call("getHostMetrics", {});
    assert.equal(host.status, 200);
    assert.deepEqual((host.body.reading as { sandboxes: unknown }).sandboxes, {
      active: 1,
      frozen: 0,
      stopped: 0,
      archived: 0,
      restoring: 0,
    });
    const found = await call("lookupSandbox", { name: "agent-1" });
    assert.deepEqual(lookupAnswerSchema.parse(found.body), {
      found: true,
      sandbox: { id: sandbox.id, name: "agent-1", state: "active", team: "default" },
    });
    assert.deepEqual((await call("destroySandbox", { name: "agent-1" })).body, { destroyed: true });
    assert.deepEqual((await call("lookupSandbox", { name: "agent-1" })).body, { found: false });
    const health = await fetch(`${url}/healthz`);
    assert.deepEqual(Object.keys(await health.json()).sort(), [
      "build",
      "nodeId",
      "ok",
      "volumeCaps",
    ]);
  } finally {
    const status = await node.stop();
    assert.equal(status.code, 0, node.process.stderr());
    assert.match(node.process.stderr(), /"msg":"node stopped"/);
  }
});

Deno.test("node process: bad input on every route is a 4xx {message}, never a 500", async () => {
  const node = await startNode();
  try {
    const { url, token } = node;
    await post(url, "acquireSandbox", { body: { name: "a" }, token });
    const long = "a".repeat(129);
    type Case = [label: string, verb: string, init: Parameters<typeof post>[2], status: number];
    const missing: Record<string, unknown> = {
      acquireSandbox: {},
      execCommand: { name: "a" },
      writeFile: { name: "a" },
      readFile: { name: "a" },
      updateMetadata: { name: "a" },
      destroySandbox: {},
      getSandboxMetrics: {},
      lookupSandbox: {},
    };
    const wrongTypes: Record<string, unknown> = {
      acquireSandbox: { name: 5 },
      listSandboxes: { states: "active" },
      execCommand: { name: "a", command: 5 },
      writeFile: { name: "a", path: 1, content: "x" },
      readFile: { name: "a", path: [] },
      updateMetadata: { name: "a", metadata: "x" },
      destroySandbox: { name: true },
      getSandboxMetrics: { name: null },
      lookupSandbox: { id: 5 },
    };
    const withName: Record<string, unknown> = {
      execCommand: { command: "true" },
      writeFile: { path: "/x", content: "x" },
      readFile: { path: "/x" },
      updateMetadata: { metadata: {} },
    };
    const cases: Case[] = [];
    for (const verb of nativeVerbs) {
      cases.push([`${verb} without a token`, verb, { token: null }, 401]);
      cases.push([`${verb} with a wrong token`, verb, { token: "w".repeat(48) }, 401]);
      cases.push([`${verb} with malformed JSON`, verb, { token, raw: '{"name": "a",' }, 400]);
      cases.push([`${verb} with GET`, verb, { token, method: "GET" }, 405]);
      if (verb in missing) {
        cases.push([`${verb} missing a field`, verb, { token, body: missing[verb] }, 400]);
      }
      if (verb in wrongTypes) {
        cases.push([`${verb} with a wrong type`, verb, { token, body: wrongTypes[verb] }, 400]);
      }
      if (verb !== "listSandboxes" && verb !== "getHostMetrics") {
        const body = { ...(withName[verb] as object ?? {}), name: long };
        cases.push([`${verb} with a 129-char name`, verb, { token, body }, 400]);
      }
    }
    cases.push(["an unknown verb", "makeCoffee", { token }, 404]);
    cases.push(["an unknown verb without a token", "makeCoffee", {}, 404]);
    cases.push(["a nested unknown path", "a/b/c", { token }, 404]);
    cases.push(["POST /healthz", "healthz", { token }, 405]);
    for (const [label, verb, init, status] of cases) {
      const answer = await post(url, verb, init);
      assert.equal(answer.status, status, `${label}: ${JSON.stringify(answer.body)}`);
      assertSentence(answer, label);
    }
    const named = await post(url, "acquireSandbox", { token, body: { name: long } });
    assert.match(String(named.body.message), /'name'.*128/);
    const field = await post(url, "execCommand", { token, body: { name: "a" } });
    assert.match(String(field.body.message), /execCommand: 'command'/);
  } finally {
    await node.stop();
  }
});

Deno.test("node process: a second node on the same data dir exits at boot naming the file", async () => {
  const first = await startNode();
  try {
    const second = spawnDeno(nodeMain, {
      env: {
        DORMICE_API_TOKEN: first.token,
        DORMICE_PORT: String(first.port + 1 > 65535 ? first.port - 1 : first.port + 1),
        DORMICE_DATA_DIR: first.dataDir,
        DORMICE_EXECUTOR: "fake",
      },
      permissions: nodePermissions(first.dataDir),
    });
    const status = await second.exited;
    assert.notEqual(status.code, 0);
    assert.match(second.stderr(), /ledger\.db.*another process holds it.*DORMICE_DATA_DIR/);
    // The first node still serves.
    const health = await fetch(`${first.url}/healthz`);
    assert.equal(health.status, 200);
    await health.body?.cancel();
  } finally {
    await first.stop();
  }
});

Deno.test("node process: a bad variable is refused at boot with a sentence, token unprinted", async () => {
  const dataDir = await Deno.makeTempDir();
  try {
    const p = spawnDeno(nodeMain, {
      env: { DORMICE_API_TOKEN: "short-secret", DORMICE_DATA_DIR: dataDir, DORMICE_PORT: "http" },
      permissions: nodePermissions(dataDir),
    });
    const status = await p.exited;
    assert.equal(status.code, 2);
    assert.match(p.stderr(), /DORMICE_API_TOKEN is 12 characters long/);
    assert.match(p.stderr(), /DORMICE_PORT='http'/);
    assert.doesNotMatch(p.stderr(), /short-secret/);
  } finally {
    await Deno.remove(dataDir, { recursive: true });
  }
});

Deno.test("node process: a data dir outside its --allow-write says which flags to run with", async () => {
  const granted = await Deno.makeTempDir();
  const elsewhere = await Deno.makeTempDir();
  try {
    const p = spawnDeno(nodeMain, {
      env: {
        DORMICE_API_TOKEN: newToken(),
        DORMICE_DATA_DIR: `${elsewhere}/node`,
        DORMICE_EXECUTOR: "fake",
        DORMICE_PORT: String(freePort()),
      },
      permissions: nodePermissions(granted),
    });
    const status = await p.exited;
    assert.equal(status.code, 2);
    assert.match(
      p.stderr(),
      new RegExp(
        `Cannot create DORMICE_DATA_DIR='${elsewhere}/node' .*deno task node may read and write ` +
          `only under \\.dormice; .* --allow-read=${elsewhere}/node --allow-write=${elsewhere}/node`,
      ),
    );
  } finally {
    await Deno.remove(granted, { recursive: true });
    await Deno.remove(elsewhere, { recursive: true });
  }
});

Deno.test("node process: checks in with a stub gateway", async () => {
  const bodies: { auth: string | null; body: unknown }[] = [];
  let arrived!: () => void;
  const first = new Promise<void>((resolve) => arrived = resolve);
  const gateway = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (req) => {
      bodies.push({ auth: req.headers.get("authorization"), body: await req.json() });
      arrived();
      return Response.json({ ok: true });
    },
  );
  const node = await startNode({
    env: {
      DORMICE_GATEWAY_ENDPOINT: `http://127.0.0.1:${gateway.addr.port}`,
      DORMICE_NODE_ID: "node-x",
    },
  });
  try {
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      first,
      new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`No check-in:\n${node.process.stderr()}`)),
          15_000,
        );
      }),
    ]);
    clearTimeout(timer);
    const { auth, body } = bodies[0];
    assert.equal(auth, `Bearer ${node.token}`);
    const checkIn = checkInSchema.parse(body);
    assert.equal(checkIn.nodeId, "node-x");
    assert.equal(checkIn.endpoint, node.url);
    assert.equal(checkIn.intervalSeconds, 15);
    assert.equal(checkIn.reading.cpuUsedPct, null);
  } finally {
    await node.stop();
    await gateway.shutdown();
  }
  assert.match(node.process.stderr(), /checked in with the gateway/);
  assert.doesNotMatch(node.process.stderr(), new RegExp(node.token));
});
