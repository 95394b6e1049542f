/**
 * The Docker engine lost in the middle of a command. A real node process runs on the Docker
 * executor with its engine socket pointed at a proxy process the test controls
 * (`_engine_proxy.ts`, forwarding to the real engine socket): SIGUSR1 to the proxy drops the
 * command's stream while the engine still answers; killing the proxy loses the engine itself.
 * The real dockerd is never touched (other suites share it).
 *
 * Needs an engine and the base image: with `CI=true` it never skips; off CI it skips with a
 * printed reason.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { DEFAULT_DOCKER_SOCKET, DockerExecutor } from "../node/executors/docker/mod.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import { decodeEnvelopes, encodeEnvelope } from "../node/faces/connect_codec.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";
import { spawnDeno, type SpawnedProcess } from "./_processes.ts";

const gate = await dockerGate("docker lost-engine suite");

const proxyScript = fileURLToPath(new URL("./_engine_proxy.ts", import.meta.url));

/** The proxy process on a fresh socket, once it listens. */
async function startProxy(dir: string): Promise<{ socket: string; process: SpawnedProcess }> {
  const socket = `${dir}/engine.sock`;
  const process = spawnDeno(proxyScript, {
    args: [socket, DEFAULT_DOCKER_SOCKET],
    permissions: [
      `--allow-net=unix:${socket},unix:${DEFAULT_DOCKER_SOCKET}`,
      `--allow-read=${dir},${DEFAULT_DOCKER_SOCKET}`,
      `--allow-write=${dir},${DEFAULT_DOCKER_SOCKET}`,
    ],
  });
  await until("the engine proxy to listen", () => {
    if (process.stderr()) throw new Error(`The engine proxy failed: ${process.stderr()}`);
    return Promise.resolve(process.stdout().includes("ready"));
  });
  return { socket, process };
}

interface Fixture {
  socket: string;
  proxy: SpawnedProcess;
  node: DockerNodeProcess;
  /** The sandbox's ledger id. */
  id: string;
  native(verb: string, body: unknown): Promise<Response>;
  /** Starts a command on envd's Process/Start; the answer's body streams its events. */
  envdStart(script: string): Promise<Response>;
  /** Whether the sandbox runs `sleep <seconds>`, read on the real engine socket. */
  running(seconds: number): Promise<boolean>;
  close(): Promise<void>;
}

async function fixture(): Promise<Fixture> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-proxy-" });
  const { socket, process: proxy } = await startProxy(dir);
  const nodeId = `dkeng-${crypto.randomUUID().slice(0, 8)}`;
  let node: DockerNodeProcess | undefined;
  const direct = new DockerExecutor({ nodeId });
  const close = async () => {
    await proxy.stop(1_000);
    await node?.stop();
    await direct.close();
    await removeContainersOf([nodeId]);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  try {
    node = await startDockerNode({ nodeId, socket });
    const n = node;
    const native = (verb: string, body: unknown) =>
      fetch(`${n.url}/${verb}`, {
        method: "POST",
        headers: { authorization: `Bearer ${n.token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const created = await (await native("acquireSandbox", { name: "box", template: "minimal" }))
      .json();
    const id: string = created.sandbox?.id;
    assert.ok(id, JSON.stringify(created));
    const envdStart = (script: string) =>
      fetch(`${n.url}/e2b/envd/process.Process/Start`, {
        method: "POST",
        headers: {
          "content-type": "application/connect+json",
          "e2b-sandbox-id": id,
          "x-access-token": AccessTokens.fromFleetToken(n.token).forSandbox(id),
        },
        body: encodeEnvelope(0, { process: { cmd: "/bin/sh", args: ["-c", script] } }),
      });
    const running = async (seconds: number) => {
      const handle = await direct.exec(id, {
        cmd: ["/bin/sh", "-c", 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done'],
      });
      const [out] = await Promise.all([new Response(handle.stdout).text(), handle.exited]);
      return out.split("\n").some((line) => line.trim() === `sleep ${seconds}`);
    };
    return { socket, proxy, node, id, native, envdStart, running, close };
  } catch (error) {
    await close();
    throw error;
  }
}

Deno.test({
  name: "docker: a command whose engine stream drops is killed and answered 503, not exit -1",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const f = await fixture();
  try {
    const answer = f.native("execCommand", { name: "box", command: "echo begun; sleep 301" });
    await until("the command to run", () => f.running(301));
    // The engine still answers new connections: only the command's stream is lost.
    f.proxy.child.kill("SIGUSR1");
    const res = await answer;
    const body = await res.json();
    assert.equal(res.status, 503, JSON.stringify(body));
    assert.deepEqual(Object.keys(body), ["message"]);
    assert.match(
      body.message,
      new RegExp(
        `^The Docker engine on ${f.socket} dropped the output stream of command \\d+ in ` +
          `sandbox ${f.id} while it still ran: it was killed`,
      ),
    );
    assert.equal(await f.running(301), false, "the command must not run on for nobody");
  } finally {
    await f.close();
  }
});

Deno.test({
  name:
    "docker: a lost engine mid-command is a 503 and a Connect error, the command reported running",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const f = await fixture();
  try {
    const exec = f.native("execCommand", { name: "box", command: "sleep 302" });
    const start = await f.envdStart("echo begun; sleep 303");
    assert.equal(start.status, 200);
    await until("both commands to run", async () => (await f.running(302)) && f.running(303));
    await f.proxy.stop(1_000);

    const lost = new RegExp(
      `^Lost the Docker engine on ${f.socket} while command \\d+ in sandbox ${f.id} ran: it ` +
        "may still be running there",
    );
    const res = await exec;
    const body = await res.json();
    assert.equal(res.status, 503, JSON.stringify(body));
    assert.match(body.message, lost);

    const envelopes = decodeEnvelopes(new Uint8Array(await start.arrayBuffer()));
    const events = envelopes.slice(0, -1).map((e) =>
      Object.keys((e.message as { event: object }).event)[0]
    );
    assert.equal(events[0], "start");
    assert.ok(!events.includes("end"), `no end event for an end nobody saw: ${events}`);
    const last = envelopes.at(-1)!;
    assert.equal(last.flags, 2);
    const error = (last.message as { error: { code: string; message: string } }).error;
    assert.equal(error?.code, "unavailable", JSON.stringify(last.message));
    assert.match(error.message, lost);

    // Reported as still running, and it is: nothing could stop it without the engine.
    assert.ok(await f.running(302));
    assert.ok(await f.running(303));
  } finally {
    await f.close();
  }
});
