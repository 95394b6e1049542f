/**
 * Both daemons run from the package, as `deno run jsr:@dormice/cluster/gateway/main` and
 * `…/node/main` (this project's `deno.json` links the package from its path), each with
 * `--allow-env` naming exactly the variables the package says it reads: the node checks in with the
 * gateway, and a sandbox is acquired through the gateway.
 */
import assert from "node:assert/strict";
import { gatewayEnvVariables } from "@dormice/cluster/gateway";
import { nodeEnvVariables } from "@dormice/cluster/node";

const token = "d".repeat(32);

/** A daemon started from the package, its JSON log lines read as they come. */
interface Daemon {
  /** Resolves with the first log line whose `msg` is `msg`; rejects past `timeoutMs`. */
  logged(msg: string, timeoutMs: number): Promise<Record<string, unknown>>;
  /** SIGTERM, then the exit status (SIGKILL if it has not exited within 15 s). */
  stop(): Promise<Deno.CommandStatus>;
}

function start(
  specifier: string,
  flags: string[],
  env: Record<string, string>,
): Daemon {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--quiet", "--frozen", ...flags, specifier],
    // The directory whose deno.json links the package: the specifier resolves there.
    cwd: new URL(".", import.meta.url).pathname,
    env: { ...env, NO_COLOR: "1" },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const lines: Record<string, unknown>[] = [];
  let text = "";
  const waiters = new Set<() => void>();
  let ended = false;
  // Drains stderr to its end, so a chatty daemon never blocks on a full pipe.
  const drained = (async () => {
    for await (
      const chunk of child.stderr.pipeThrough(new TextDecoderStream())
    ) {
      text += chunk;
      let at;
      while ((at = text.indexOf("\n")) >= 0) {
        const line = text.slice(0, at);
        text = text.slice(at + 1);
        try {
          lines.push(JSON.parse(line));
        } catch {
          lines.push({ msg: line });
        }
      }
      for (const wake of waiters) wake();
    }
    ended = true;
    for (const wake of waiters) wake();
  })();
  return {
    logged(msg, timeoutMs) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = lines.find((l) => l.msg === msg);
          if (found === undefined && !ended) return;
          waiters.delete(check);
          clearTimeout(timer);
          if (found !== undefined) resolve(found);
          else reject(new Error(`exited before '${msg}':\n${JSON.stringify(lines)}`));
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(
            new Error(
              `no '${msg}' within ${timeoutMs} ms:\n${JSON.stringify(lines)}`,
            ),
          );
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch {
        // Already exited.
      }
      const kill = setTimeout(() => child.kill("SIGKILL"), 15_000);
      const status = await child.status;
      clearTimeout(kill);
      await drained;
      return status;
    },
  };
}

/** A loopback port free now (the node must know its own endpoint before it listens). */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  listener.close();
  return port;
}

Deno.test("the gateway and node daemons run from the package with --allow-env naming only their variables", async () => {
  const dir = await Deno.makeTempDir({ prefix: "dormice-embedder-" });
  const gateway = start("jsr:@dormice/cluster/gateway/main", [
    "--unstable-no-legacy-abort",
    "--allow-net=127.0.0.1",
    `--allow-env=${gatewayEnvVariables.join(",")}`,
    `--allow-read=${dir}`,
    `--allow-write=${dir}`,
  ], {
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_PORT: "0",
    DORMICE_GATEWAY_DB: `${dir}/gateway.db`,
  });
  let node: Daemon | undefined;
  try {
    const listening = await gateway.logged("gateway listening", 60_000);
    const gatewayUrl = String(listening.url);
    const nodePort = freePort();
    node = start("jsr:@dormice/cluster/node/main", [
      "--allow-net=127.0.0.1",
      `--allow-env=${nodeEnvVariables.join(",")}`,
      "--ignore-env",
      `--allow-read=${dir}`,
      `--allow-write=${dir}`,
      "--allow-sys=cpus,systemMemoryInfo,statfs",
    ], {
      DORMICE_API_TOKEN: token,
      DORMICE_EXECUTOR: "fake",
      DORMICE_PORT: String(nodePort),
      DORMICE_DATA_DIR: `${dir}/node`,
      DORMICE_NODE_ID: "node-pkg",
      DORMICE_NODE_ENDPOINT: `http://127.0.0.1:${nodePort}`,
      DORMICE_GATEWAY_ENDPOINT: gatewayUrl,
    });
    await node.logged("node listening", 60_000);

    const headers = {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
    };
    // The node checks in at once when it starts; the acquire waits for nothing else.
    let res: Response | undefined;
    for (let attempt = 0; attempt < 100; attempt++) {
      res = await fetch(`${gatewayUrl}/listNodes`, {
        method: "POST",
        headers,
        body: "{}",
      });
      const { nodes } = await res.json();
      if (nodes.some((n: { id: string }) => n.id === "node-pkg")) break;
      res = undefined;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(res, "node-pkg checked in with the gateway within 10 s");
    const made = await fetch(`${gatewayUrl}/acquireSandbox`, {
      method: "POST",
      headers,
      body: JSON.stringify({ name: "from-the-package" }),
    });
    const body = await made.json();
    assert.equal(made.status, 200, JSON.stringify(body));
    assert.equal(body.sandbox.nodeId, "node-pkg");
  } finally {
    const nodeExit: Deno.CommandStatus | undefined = node && await node.stop();
    const gatewayExit = await gateway.stop();
    await Deno.remove(dir, { recursive: true });
    assert.equal(nodeExit?.code, 0, "the node stops cleanly on SIGTERM");
    assert.equal(gatewayExit.code, 0, "the gateway stops cleanly on SIGTERM");
  }
});
