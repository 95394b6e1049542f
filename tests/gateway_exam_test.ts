/**
 * The gateway's black-box exam: real gateway and node processes on loopback, spoken to
 * only with `fetch`. Direct calls to a node stage what the gateway must then find.
 *
 * Fleets:
 * - G1 with nodes A and B (fake executor, check-in every second): cases 1–4, 7–10, 13; case 14
 *   adds node F and freezes it with SIGSTOP, and a G4 with a short head timeout that knows F
 *   only through a check-in with a long interval;
 * - G2 (active limit 2) and G3 know A and B only through check-ins this test posts, with fixed
 *   readings and a long interval, so in-flight counts are never reset by a real check-in: cases
 *   5 and 6 stay deterministic; G3 also hosts the SYN-dropping node of case 11;
 * - G5, with lookup and head bounds far away, hosts only the stub node of case 12.
 */
import assert from "node:assert/strict";
import { freePort, newToken, type NodeProcess, spawnDeno, startNode } from "./_processes.ts";
import {
  gatewayMain,
  gatewayPermissions,
  type GatewayProcess,
  postJson,
  startGateway,
} from "./_gateway.ts";
import { droppedSyns, dropSyns, synDropGate } from "./support/syn_drop.ts";

// Case 11 needs root and iptables: skipped with a printed reason off CI, a failure with CI=true.
const synDrop = await synDropGate("case 11 of the gateway exam (a node whose port drops SYNs)");

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A check-in body with a fixed reading, for nodes the test registers itself. */
function syntheticCheckIn(nodeId: string, endpoint: string, intervalSeconds = 60) {
  return {
    nodeId,
    endpoint,
    intervalSeconds,
    build: "exam",
    reading: {
      takenAt: Date.now(),
      cpuCount: 4,
      cpuUsedPct: 5,
      memoryTotalBytes: 16e9,
      memoryAvailableBytes: 8e9,
      swapTotalBytes: 0,
      swapFreeBytes: 0,
      dataDisk: null,
      sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    },
  };
}

/** Polls `check` every 100 ms until it returns true or `ms` passes. */
async function until(what: string, check: () => Promise<boolean>, ms = 8000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

/** Which of `nodes` hold `name` in their own ledger, asked directly. */
async function holders(token: string, nodes: NodeProcess[], name: string): Promise<string[]> {
  const out: string[] = [];
  for (const node of nodes) {
    const r = await postJson(node.url, token, "lookupSandbox", { name });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    if (r.body.found) out.push(node.url);
  }
  return out;
}

Deno.test({
  name: "gateway exam: a gateway in front of real nodes, spoken to only with fetch",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const g1Port = freePort();
  const g1Url = `http://127.0.0.1:${g1Port}`;
  const nodeEnv = (id: string) => ({
    DORMICE_GATEWAY_ENDPOINT: g1Url,
    DORMICE_NODE_ID: id,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
  });
  const started: { stop(): Promise<unknown> }[] = [];
  const keep = <T extends { stop(): Promise<unknown> }>(p: Promise<T>) =>
    p.then((x) => {
      started.push(x);
      return x;
    });
  let g1!: GatewayProcess, g2!: GatewayProcess, g3!: GatewayProcess;
  let a!: NodeProcess, b!: NodeProcess;
  try {
    [g1, g2, g3, a, b] = await Promise.all([
      // The host's real CPU use is noise from whatever else runs on the machine, not a test input.
      keep(
        startGateway({ token, port: g1Port, env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } }),
      ),
      keep(startGateway({ token, env: { DORMICE_GATEWAY_NODE_ACTIVE_LIMIT: "2" } })),
      keep(startGateway({ token })),
      keep(startNode({ token, env: nodeEnv("node-a") })),
      keep(startNode({ token, env: nodeEnv("node-b") })),
    ]);
    const both = [a, b];

    await t.step(
      "1. /healthz is open; a wrong or missing token is a 401 on every other route",
      async () => {
        const health = await fetch(`${g1.url}/healthz`);
        assert.equal(health.status, 200);
        await health.body?.cancel();
        const routes = [
          "checkIn",
          "listNodes",
          "removeNode",
          "acquireSandbox",
          "listSandboxes",
          "execCommand",
          "writeFile",
          "readFile",
          "updateMetadata",
          "destroySandbox",
          "getSandboxMetrics",
          "getHostMetrics",
          "lookupSandbox",
          "noSuchVerb",
        ];
        for (const route of routes) {
          for (const header of [undefined, "Bearer wrong-token-0123456789abcdef0123456789"]) {
            const res = await fetch(`${g1.url}/${route}`, {
              method: "POST",
              headers: header ? { authorization: header } : {},
              body: JSON.stringify({ name: "x" }),
            });
            assert.equal(res.status, 401, `${route} with ${header ?? "no token"}`);
            assert.match((await res.json()).message, /token/);
          }
        }
      },
    );

    await t.step("2. both nodes are listed and up after their first check-in", async () => {
      await until("node-a and node-b up", async () => {
        const { body } = await g1.json("listNodes");
        const up = body.nodes.filter((n: { state: string }) => n.state === "up");
        return up.length === 2;
      });
      const { body } = await g1.json("listNodes");
      const byId = new Map(body.nodes.map((n: { id: string }) => [n.id, n]));
      for (const [id, node] of [["node-a", a], ["node-b", b]] as const) {
        // deno-lint-ignore no-explicit-any
        const n = byId.get(id) as any;
        assert.equal(n.endpoint, node.url);
        assert.equal(n.state, "up");
        assert.equal(typeof n.lastCheckInAgeMs, "number");
        assert.equal(typeof n.reading.cpuCount, "number");
        assert.equal(n.inFlight, 0);
      }
    });

    await t.step(
      "13. a second gateway on the same database file exits non-zero naming the conflict",
      async () => {
        const second = spawnDeno(gatewayMain, {
          env: {
            DORMICE_API_TOKEN: token,
            DORMICE_GATEWAY_PORT: String(freePort()),
            DORMICE_GATEWAY_DB: g1.dbPath,
          },
          permissions: gatewayPermissions(g1.dir),
        });
        // Bounded: a gateway that wrongly starts would otherwise hold the exam open for ever.
        let timer: ReturnType<typeof setTimeout> | undefined;
        const status = await Promise.race([
          second.exited,
          new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), 15_000)),
        ]);
        clearTimeout(timer);
        if (status === null) {
          await second.stop();
          assert.fail(
            "The second gateway kept running on the same database file: the lock did not hold",
          );
        }
        assert.notEqual(status.code, 0);
        assert.match(
          second.stderr(),
          new RegExp(`${g1.dbPath}.*another process.*DORMICE_GATEWAY_DB`),
        );
      },
    );

    await t.step(
      "5. six new names over two equal nodes land three and three inside one interval",
      async () => {
        for (const [id, node] of [["eq-a", a], ["eq-b", b]] as const) {
          const r = await g3.json("checkIn", syntheticCheckIn(id, node.url));
          assert.equal(r.status, 200, JSON.stringify(r.body));
        }
        const names = Array.from({ length: 6 }, (_, i) => `c5-six-${i}`);
        const answers = await Promise.all(names.map((name) => g3.json("acquireSandbox", { name })));
        for (const r of answers) assert.equal(r.status, 200, JSON.stringify(r.body));
        let onA = 0, onB = 0;
        for (const name of names) {
          const where = await holders(token, both, name);
          assert.equal(where.length, 1, `${name} is in exactly one ledger`);
          if (where[0] === a.url) onA++;
          else onB++;
        }
        assert.deepEqual([onA, onB], [3, 3]);
      },
    );

    await t.step(
      "6. active limit 2: the fifth acquire is a 503; a create + destroy gives the slot back; a wake takes none",
      async () => {
        for (const [id, node] of [["lim-a", a], ["lim-b", b]] as const) {
          const r = await g2.json("checkIn", syntheticCheckIn(id, node.url));
          assert.equal(r.status, 200, JSON.stringify(r.body));
        }
        for (let i = 1; i <= 4; i++) {
          const r = await g2.json("acquireSandbox", { name: `c6-${i}` });
          assert.equal(r.status, 200, JSON.stringify(r.body));
          assert.equal(r.body.created, true);
        }
        const fifth = await g2.json("acquireSandbox", { name: "c6-5" });
        assert.equal(fifth.status, 503);
        assert.ok(Number(fifth.headers.get("retry-after")) >= 1);
        for (const id of ["lim-a", "lim-b"]) {
          assert.match(fifth.body.message, new RegExp(`'${id}': .*reaches the limit 2`));
        }
        // A sandbox this gateway never placed, on the node whose slot was given back: waking it
        // must not take that slot.
        const [home] = await holders(token, both, "c6-4");
        const destroyed = await g2.json("destroySandbox", { name: "c6-4" });
        assert.equal(destroyed.status, 200);
        assert.equal(destroyed.body.destroyed, true);
        assert.equal(
          (await postJson(home, token, "acquireSandbox", { name: "c6-direct" })).status,
          200,
        );
        const wake = await g2.json("acquireSandbox", { name: "c6-direct" });
        assert.equal(wake.status, 200);
        assert.equal(wake.body.created, false);
        const again = await g2.json("acquireSandbox", { name: "c6-5" });
        assert.equal(again.status, 200, JSON.stringify(again.body));
        assert.equal(again.body.created, true);
        const full = await g2.json("acquireSandbox", { name: "c6-6" });
        assert.equal(full.status, 503);
      },
    );

    await t.step(
      "3. an acquire lands in exactly one ledger; re-acquire finds it; exec and files round-trip",
      async () => {
        const first = await g1.json("acquireSandbox", { name: "c3-agent" });
        assert.equal(first.status, 200, JSON.stringify(first.body));
        assert.equal(first.body.created, true);
        assert.equal((await holders(token, both, "c3-agent")).length, 1);
        const again = await g1.json("acquireSandbox", { name: "c3-agent" });
        assert.equal(again.body.created, false);
        assert.equal(again.body.sandbox.id, first.body.sandbox.id);
        const exec = await g1.json("execCommand", { name: "c3-agent", command: "echo hello" });
        assert.equal(exec.status, 200, JSON.stringify(exec.body));
        assert.equal(exec.body.stdout, "hello\n");
        assert.equal(exec.body.exitCode, 0);
        const write = await g1.json("writeFile", {
          name: "c3-agent",
          path: "/tmp/note.txt",
          content: "round trip ✓",
        });
        assert.equal(write.status, 200, JSON.stringify(write.body));
        const read = await g1.json("readFile", { name: "c3-agent", path: "/tmp/note.txt" });
        assert.equal(read.status, 200, JSON.stringify(read.body));
        const bytes = Uint8Array.from(atob(read.body.contentBase64), (c) => c.charCodeAt(0));
        assert.equal(new TextDecoder().decode(bytes), "round trip ✓");
      },
    );

    await t.step(
      "4. twenty simultaneous acquires of one new name build one sandbox fleet-wide",
      async () => {
        const answers = await Promise.all(
          Array.from({ length: 20 }, () => g1.json("acquireSandbox", { name: "c4-burst" })),
        );
        for (const r of answers) assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(answers.filter((r) => r.body.created).length, 1);
        assert.equal(new Set(answers.map((r) => r.body.sandbox.id)).size, 1);
        assert.equal((await holders(token, both, "c4-burst")).length, 1);
      },
    );

    await t.step(
      "7. created directly on B is routed at once; on both is a 409; a destroy behind the back evicts",
      async () => {
        const direct = await postJson(b.url, token, "acquireSandbox", { name: "c7-on-b" });
        assert.equal(direct.status, 200);
        const routed = await g1.json("lookupSandbox", { name: "c7-on-b" });
        assert.equal(routed.body.found, true);
        assert.equal(routed.body.sandbox.id, direct.body.sandbox.id);
        const exec = await g1.json("execCommand", { name: "c7-on-b", command: "echo routed" });
        assert.equal(exec.body.stdout, "routed\n");

        for (const node of both) {
          assert.equal(
            (await postJson(node.url, token, "acquireSandbox", { name: "c7-dup" })).status,
            200,
          );
        }
        const conflict = await g1.json("execCommand", { name: "c7-dup", command: "true" });
        assert.equal(conflict.status, 409);
        assert.match(conflict.body.message, /'node-a'/);
        assert.match(conflict.body.message, /'node-b'/);

        const made = await g1.json("acquireSandbox", { name: "c7-gone" });
        assert.equal(made.status, 200);
        const [home] = await holders(token, both, "c7-gone");
        const other = home === a.url ? b : a;
        const killed = await postJson(home, token, "destroySandbox", { name: "c7-gone" });
        assert.equal(killed.body.destroyed, true);
        const gone = await g1.json("execCommand", { name: "c7-gone", command: "true" });
        assert.equal(gone.status, 404);
        // Rebuilt elsewhere behind the gateway's back: only an evicted cache finds the new one.
        assert.equal(
          (await postJson(other.url, token, "acquireSandbox", { name: "c7-gone" })).status,
          200,
        );
        const found = await g1.json("execCommand", { name: "c7-gone", command: "echo found" });
        assert.equal(found.status, 200, JSON.stringify(found.body));
        assert.equal(found.body.stdout, "found\n");
      },
    );

    await t.step("8. a 129-character name is a 400, not a 503", async () => {
      for (const verb of ["acquireSandbox", "execCommand", "destroySandbox"]) {
        const r = await g1.json(verb, { name: "n".repeat(129), command: "true" });
        assert.equal(r.status, 400, verb);
        assert.match(r.body.message, /'name'/);
      }
    });

    await t.step(
      "10. a check-in under node A's id from another endpoint is a 409 naming both; a path is a 400",
      async () => {
        const elsewhere = "http://127.0.0.1:1";
        // Node A checks in each second and keeps its id while it was heard within one interval.
        // A check-in of A's that came late on a slow host once let the twin take the id (a 200):
        // the twin is sent right after one of A's, so A is surely alive when it arrives.
        await until("a fresh check-in of node-a", async () => {
          const { body } = await g1.json("listNodes");
          const nodeA = body.nodes.find((n: { id: string }) => n.id === "node-a");
          return nodeA !== undefined && nodeA.lastCheckInAgeMs < 250;
        });
        const twin = await g1.json("checkIn", syntheticCheckIn("node-a", elsewhere, 1));
        assert.equal(twin.status, 409, JSON.stringify(twin.body));
        assert.ok(twin.body.message.includes(a.url), twin.body.message);
        assert.ok(twin.body.message.includes(elsewhere), twin.body.message);
        const withPath = await g1.json("checkIn", syntheticCheckIn("node-z", `${a.url}/api`, 1));
        assert.equal(withPath.status, 400);
        assert.match(withPath.body.message, /'endpoint'.*path/);
      },
    );

    await t.step(
      "9. node C joins, dies (502 / 503 naming it), 409 on removeNode while alive, then removed",
      async () => {
        const c = await keep(startNode({ token, env: nodeEnv("node-c") }));
        await until("node-c up", async () => {
          const { body } = await g1.json("listNodes");
          return body.nodes.some((n: { id: string; state: string }) =>
            n.id === "node-c" && n.state === "up"
          );
        });
        // C is empty, so the lowest score: the next new names go there.
        let onC: string | undefined;
        for (let i = 0; i < 5 && onC === undefined; i++) {
          const r = await g1.json("acquireSandbox", { name: `c9-${i}` });
          assert.equal(r.status, 200, JSON.stringify(r.body));
          if (r.body.sandbox.nodeId === "node-c") onC = `c9-${i}`;
        }
        assert.ok(onC, "a new name was placed on node-c");
        const alive = await g1.json("removeNode", { nodeId: "node-c" });
        assert.equal(alive.status, 409);
        assert.match(alive.body.message, /still checks in/);

        await c.stop();
        const dead = await g1.json("execCommand", { name: onC, command: "true" });
        assert.equal(dead.status, 502);
        assert.match(dead.body.message, /'node-c'/);
        const fresh = await g1.json("acquireSandbox", { name: "c9-new" });
        assert.equal(fresh.status, 503);
        assert.match(fresh.body.message, /'node-c'/);
        assert.ok(Number(fresh.headers.get("retry-after")) >= 1);

        await until("node-c down", async () => {
          const { body } = await g1.json("listNodes");
          return body.nodes.some((n: { id: string; state: string }) =>
            n.id === "node-c" && n.state === "down"
          );
        });
        const removed = await g1.json("removeNode", { nodeId: "node-c" });
        assert.equal(removed.status, 200, JSON.stringify(removed.body));
        const placed = await g1.json("acquireSandbox", { name: "c9-new" });
        assert.equal(placed.status, 200, JSON.stringify(placed.body));
        assert.ok(["node-a", "node-b"].includes(placed.body.sandbox.nodeId));
      },
    );

    await t.step(
      "14. a frozen node (SIGSTOP): waits end naming it, then a 503 at once; nothing built elsewhere",
      async () => {
        const f = await keep(startNode({ token, env: nodeEnv("node-f") }));
        let frozen = false;
        const thaw = () => {
          if (!frozen) return;
          f.process.child.kill("SIGCONT");
          frozen = false;
        };
        // G4 knows F only through a check-in with a long interval, so F never looks silent there:
        // only the head's own bound can end a wait.
        const g4 = await keep(
          startGateway({ token, env: { DORMICE_GATEWAY_HEAD_TIMEOUT_MS: "1500" } }),
        );
        try {
          await until("node-f up", async () => {
            const { body } = await g1.json("listNodes");
            return body.nodes.some((n: { id: string; state: string }) =>
              n.id === "node-f" && n.state === "up"
            );
          });
          const made = await postJson(f.url, token, "acquireSandbox", { name: "c14-frozen" });
          assert.equal(made.status, 200, JSON.stringify(made.body));
          assert.equal((await g4.json("checkIn", syntheticCheckIn("node-f", f.url))).status, 200);
          for (const g of [g1, g4]) {
            const warm = await g.json("execCommand", { name: "c14-frozen", command: "echo warm" });
            assert.equal(warm.body.stdout, "warm\n", JSON.stringify(warm.body));
          }

          f.process.child.kill("SIGSTOP");
          frozen = true;
          // Unbounded here: each gateway's own bound must end its wait (G1's head bound is the
          // default 120 s, so a G1 that did not hear F stop checking in answers with that one).
          const ask = (g: GatewayProcess) =>
            g.json("execCommand", { name: "c14-frozen", command: "echo x" });
          const [viaG1, viaG4] = await Promise.all([ask(g1), ask(g4)]);
          // G1 hears F stop checking in (two 1 s intervals) and ends the wait: the answer names
          // that cause, not its head bound.
          assert.equal(viaG1.status, 504, JSON.stringify(viaG1.body));
          assert.match(viaG1.body.message, /'node-f' at .* stopped checking in/);
          // G4 still thinks F is fine: its 1500 ms head bound, and nothing else, ends the wait.
          assert.equal(viaG4.status, 504, JSON.stringify(viaG4.body));
          assert.match(viaG4.body.message, /'node-f' at .* sent no answer within 1500 ms/);

          const { body: listed } = await g1.json("listNodes");
          assert.equal(
            listed.nodes.find((n: { id: string }) => n.id === "node-f").state,
            "down",
          );
          // At once: a 503 from what G1 knows of F, not a wait on F (which would end on the head
          // bound as a 504), and F, still frozen, is left alone.
          for (const verb of ["execCommand", "acquireSandbox"]) {
            const r = await g1.json(verb, { name: "c14-frozen", command: "echo x" });
            assert.equal(r.status, 503, `${verb}: ${JSON.stringify(r.body)}`);
            assert.match(r.body.message, /'node-f' at .* has not checked in for/);
            assert.ok(Number(r.headers.get("retry-after")) >= 1, verb);
          }
          // The name lives on the frozen node: no other node built it.
          assert.deepEqual(await holders(token, both, "c14-frozen"), []);

          thaw();
          await until("node-f up again", async () => {
            const { body } = await g1.json("listNodes");
            return body.nodes.some((n: { id: string; state: string }) =>
              n.id === "node-f" && n.state === "up"
            );
          });
          const back = await g1.json("execCommand", { name: "c14-frozen", command: "echo back" });
          assert.equal(back.status, 200, JSON.stringify(back.body));
          assert.equal(back.body.stdout, "back\n");
        } finally {
          thaw();
        }
      },
    );

    await t.step(
      "12. a slow first byte does not hold the head; a client hang-up stops the node's work",
      async () => {
        // G5 knows only the stub, and its lookup and head bounds are far away (60 s, an hour): a
        // request of this case aborted at the stub was aborted by the client's hang-up.
        const g5 = await keep(startGateway({
          token,
          env: {
            DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS: "60000",
            DORMICE_GATEWAY_HEAD_TIMEOUT_MS: "3600000",
          },
        }));
        const events: string[] = [];
        let firstByteAt = 0;
        const aborted = { lookup: false, stream: false, nohead: false };
        // Ends the stub's held requests when the step ends, so a red run fails instead of hanging.
        const stepDone = new AbortController();
        const untilAborted = (signal: AbortSignal, record: () => void) =>
          new Promise<void>((resolve) => {
            signal.addEventListener("abort", () => {
              record();
              resolve();
            });
            stepDone.signal.addEventListener("abort", () => resolve());
          });
        let execArrived!: () => void;
        const execSeen = new Promise<void>((resolve) => execArrived = resolve);
        let lookupArrived!: () => void;
        const lookupSeen = new Promise<void>((resolve) => lookupArrived = resolve);
        const stub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
          const verb = new URL(req.url).pathname.slice(1);
          const body = await req.json();
          if (verb === "lookupSandbox") {
            if (body.name === "c12-lookup") {
              lookupArrived();
              // Never answers: only the gateway giving up on it ends this request.
              await untilAborted(req.signal, () => aborted.lookup = true);
              return new Response(null, { status: 499 });
            }
            const found = typeof body.name === "string" && body.name.startsWith("c12-");
            return Response.json(
              found
                ? {
                  found: true,
                  sandbox: { id: `id-${body.name}`, name: body.name, state: "active" },
                }
                : { found: false },
            );
          }
          if (body.name === "c12-nohead") {
            // No head until the gateway gives up on this request.
            execArrived();
            await untilAborted(req.signal, () => aborted.nohead = true);
            return new Response(null, { status: 499 });
          }
          // execCommand: a stream whose first byte comes 300 ms late (c12-slow) or never ends.
          // Only the never-ending stream can be aborted by a hang-up (Deno.serve also aborts the
          // signal after a completed response).
          if (body.name === "c12-hang") {
            req.signal.addEventListener("abort", () => aborted.stream = true);
          }
          let timer: ReturnType<typeof setTimeout> | undefined;
          const stream = new ReadableStream<Uint8Array>({
            start(controller) {
              timer = setTimeout(() => {
                firstByteAt = performance.now();
                events.push("first byte sent");
                controller.enqueue(new TextEncoder().encode('{"stdout":"late"'));
                if (body.name === "c12-slow") {
                  controller.enqueue(new TextEncoder().encode("}"));
                  controller.close();
                }
              }, 300);
            },
            cancel() {
              clearTimeout(timer);
              if (body.name === "c12-hang") aborted.stream = true;
            },
          });
          return new Response(stream, { headers: { "content-type": "application/json" } });
        });
        const stubUrl = `http://127.0.0.1:${stub.addr.port}`;
        try {
          const joined = await g5.json("checkIn", syntheticCheckIn("stub", stubUrl));
          assert.equal(joined.status, 200, JSON.stringify(joined.body));

          // Found first, so what follows is only the forward, even on a loaded machine.
          const seen = await g5.json("lookupSandbox", { name: "c12-slow" });
          assert.equal(seen.body.found, true, JSON.stringify(seen.body));
          const res = await g5.call("execCommand", { name: "c12-slow", command: "x" });
          const headAt = performance.now();
          events.push("head received");
          assert.equal(res.status, 200);
          assert.equal(await res.text(), '{"stdout":"late"}');
          assert.deepEqual(events, ["head received", "first byte sent"]);
          assert.ok(headAt < firstByteAt);

          const streaming = new AbortController();
          const hang = await g5.call("execCommand", { name: "c12-hang", command: "x" }, {
            signal: streaming.signal,
          });
          assert.equal(hang.status, 200);
          const reader = hang.body!.getReader();
          await reader.read();
          streaming.abort();
          await reader.cancel().catch(() => {});
          // The bounds of these waits only keep a red run from hanging: no bound of G5's comes
          // near them.
          await until(
            "the stub sees its stream request aborted",
            () => Promise.resolve(aborted.stream),
            30_000,
          );

          const waiting = new AbortController();
          const beforeHead = g5.call("execCommand", { name: "c12-nohead", command: "x" }, {
            signal: waiting.signal,
          }).catch((e) => e);
          await execSeen;
          waiting.abort();
          await beforeHead;
          await until(
            "the stub sees its request aborted before its head",
            () => Promise.resolve(aborted.nohead),
            30_000,
          );

          const looking = new AbortController();
          const pending = g5.call("execCommand", { name: "c12-lookup", command: "x" }, {
            signal: looking.signal,
          }).catch((e) => e);
          await lookupSeen;
          looking.abort();
          await pending;
          await until(
            "the stub sees its lookup aborted, its 60 s lookup deadline far away",
            () => Promise.resolve(aborted.lookup),
            30_000,
          );
        } finally {
          stepDone.abort();
          await stub.shutdown();
        }
      },
    );

    await t.step({
      name: "11. a node whose port drops SYNs is reported not heard at the 2 s lookup deadline",
      ignore: synDrop.skip,
      fn: async () => {
        if (synDrop.failure) throw new Error(synDrop.failure);
        const port = freePort();
        const undrop = await dropSyns(port);
        try {
          assert.equal(await droppedSyns(port), 0, "precondition: the rule is installed, unused");
          const joined = await g3.json(
            "checkIn",
            syntheticCheckIn("syn-drop", `http://127.0.0.1:${port}`, 1),
          );
          assert.equal(joined.status, 200);
          // Unbounded: the round's own deadline must end it. A gateway that waited for the SYN
          // would answer on a later bound, with another cause, which the match below refuses.
          const r = await g3.json("acquireSandbox", { name: "c11-new" });
          // The case's premise: the gateway's connect met a dropped SYN, not a refusal (a rule that
          // did not match leaves a closed port, which answers at once and proves nothing).
          const dropped = await droppedSyns(port);
          assert.ok(dropped >= 1, `the rule dropped ${dropped} SYNs: the connect was not held`);
          assert.equal(r.status, 503, JSON.stringify(r.body));
          // The cause is the round's deadline, not a refused connection.
          assert.match(
            r.body.message,
            /'syn-drop' \(http:\/\/127\.0\.0\.1:\d+: No answer within 2000 ms\)/,
          );
        } finally {
          await undrop();
        }
      },
    });
  } finally {
    await Promise.all(started.map((p) => p.stop().catch(() => {})));
  }
});
