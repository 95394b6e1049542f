/**
 * A second Docker engine beside the default one (`dockerd` with its own data root, socket,
 * pidfile and exec root, no bridge, no iptables), so two nodes that share no images run on one
 * machine; Debian's `docker-registry` on a free loopback port; and what the heal exam and bench
 * read of a fleet (a sandbox's node, a fresh check-in).
 *
 * @module
 */
import assert from "node:assert/strict";
import { freePort } from "./_processes.ts";
import { dockerGate, until } from "./_docker.ts";
import type { GatewayProcess } from "./_gateway.ts";

/** A second Docker engine beside the default one, sharing no images with it. */
export interface SecondEngine {
  socket: string;
  stop(): Promise<void>;
}

/** The default engine's bridge: its name and the addresses on it (`ip -j addr`), or null. */
async function defaultBridge(): Promise<string[] | null> {
  const r = await new Deno.Command("ip", { args: ["-j", "addr", "show", "docker0"] }).output();
  if (!r.success) return null;
  const [link] = JSON.parse(new TextDecoder().decode(r.stdout)) as {
    addr_info?: { family: string; local: string; prefixlen: number }[];
  }[];
  return (link?.addr_info ?? []).filter((a) => a.family === "inet").map((a) =>
    `${a.local}/${a.prefixlen}`
  );
}

/**
 * Puts `docker0` back with `addresses` when it is gone. A `dockerd` started with `--bridge=none`
 * (or any other bridge) deletes the host's `docker0` as it starts (measured 2026-12-07), and the
 * default engine's containers on its default network then fail to start ("could not find bridge
 * docker0") until that engine restarts; the same bridge with the same address serves them again.
 */
async function restoreDefaultBridge(addresses: string[] | null): Promise<void> {
  if (addresses === null || (await defaultBridge()) !== null) return;
  const ip = (...args: string[]) => new Deno.Command("ip", { args }).output();
  await ip("link", "add", "docker0", "type", "bridge");
  for (const address of addresses) await ip("addr", "add", address, "dev", "docker0");
  await ip("link", "set", "docker0", "up");
}

/**
 * Starts `dockerd` with its own data root and socket, and loads `dormice-minimal` into it. The
 * default engine's `docker0`, which the second engine deletes as it starts, is put back.
 */
export async function startSecondEngine(): Promise<SecondEngine> {
  const bridge = await defaultBridge();
  const dir = await Deno.makeTempDir({ prefix: "dormice-dockerd-" });
  const socket = `${dir}/docker.sock`;
  const child = new Deno.Command("dockerd", {
    args: [
      "--data-root",
      `${dir}/data`,
      "-H",
      `unix://${socket}`,
      "--pidfile",
      `${dir}/docker.pid`,
      "--exec-root",
      `${dir}/exec`,
      "--bridge=none",
      "--iptables=false",
    ],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const stop = async () => {
    try {
      child.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await restoreDefaultBridge(bridge);
  };
  try {
    await until("the second dockerd to answer", async () => {
      const r = await new Deno.Command("docker", { args: ["-H", `unix://${socket}`, "info"] })
        .output();
      return r.success;
    }, 30_000);
    await restoreDefaultBridge(bridge);
    // The default engine, which every other suite shares, keeps its bridge as it was.
    if (bridge !== null) assert.deepEqual(await defaultBridge(), bridge, "docker0 is back");
    const load = await new Deno.Command("bash", {
      args: ["-c", `docker save dormice-minimal:latest | docker -H unix://${socket} load`],
    }).output();
    assert.ok(load.success, new TextDecoder().decode(load.stderr));
  } catch (error) {
    await stop();
    throw error;
  }
  return { socket, stop };
}

/** Debian's `docker-registry` on a free loopback port, deletes enabled. */
export async function startRegistry(): Promise<{ address: string; stop(): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-registry-" });
  const address = `127.0.0.1:${freePort()}`;
  await Deno.writeTextFile(
    `${dir}/config.yml`,
    `version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/data\n  delete:\n` +
      `    enabled: true\nhttp:\n  addr: ${address}\n`,
  );
  const child = new Deno.Command("docker-registry", {
    args: ["serve", `${dir}/config.yml`],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const stop = async () => {
    try {
      child.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  await until("the registry to answer", async () => {
    const r = await fetch(`http://${address}/v2/`).catch(() => undefined);
    await r?.body?.cancel();
    return r?.status === 200;
  }, 15_000);
  return { address, stop };
}

export { nodeOf } from "./_two_nodes.ts";

export interface NodeRow {
  id: string;
  state: string;
  lastCheckInAgeMs: number;
  reading: { sandboxes: { active: number } } | null;
}

/** Waits for a check-in of `nodeId` built after now (interval 1 s) that passes `test`. */
export async function freshCheckIn(
  gw: GatewayProcess,
  nodeId: string,
  what: string,
  test: (n: NodeRow) => boolean = () => true,
): Promise<void> {
  const since = Date.now();
  await until(what, async () => {
    const { body } = await gw.json("listNodes");
    return body.nodes.some((n: NodeRow) =>
      n.id === nodeId && n.lastCheckInAgeMs < Date.now() - since - 1_100 && test(n)
    );
  }, 30_000);
}

/**
 * Why an exam with a second engine cannot run here, or null when it can: Docker answers (the
 * gate of `name`), the process is root (a second dockerd needs it) and each of `bins` is
 * installed.
 */
export async function secondEngineReadiness(
  name: string,
  bins: readonly string[] = ["dockerd"],
): Promise<string | null> {
  const gate = await dockerGate(name);
  if (gate.skip) return "no Docker engine (printed above)";
  if (gate.failure) return gate.failure;
  if (Deno.uid() !== 0) return "a second dockerd needs root";
  for (const bin of bins) {
    const found = await new Deno.Command("bash", { args: ["-c", `command -v ${bin}`] }).output();
    if (!found.success) {
      return `${bin} is not installed (apt-get install ${
        bin === "docker-registry" ? "docker-registry" : "docker.io"
      })`;
    }
  }
  return null;
}

/** Removes every image labelled with one of `nodeIds`' snapshots on `socket`'s engine. */
export async function removeSnapshotImages(socket: string, nodeIds: string[]): Promise<void> {
  for (const id of nodeIds) {
    await new Deno.Command("bash", {
      args: [
        "-c",
        `docker -H unix://${socket} images -q --filter label=dormice.node=${id} | sort -u | ` +
        `xargs -r docker -H unix://${socket} rmi -f`,
      ],
      stdout: "null",
      stderr: "null",
    }).output();
  }
}
