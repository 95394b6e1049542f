/**
 * Heal on Docker, one run: a gateway (active limit 1) in front of two nodes on two engines that
 * share no images (the default one and a second `dockerd`). Each iteration: a cold create (the
 * reference), 64 MiB of random bytes written in it, a snapshot, the source killed; a create from
 * the snapshot on its holder (kept running, so the holder is full); a create from it again,
 * which heals to the other engine's node. The heal's bytes and time come from the receiving
 * node's log ("image healed from another node"). Through the official `e2b` SDK.
 *
 * Run: `deno run -A bench/probes/heal_docker.ts [runs]` (root: it starts a second dockerd).
 *
 * @module
 */
import { Sandbox } from "e2b";
import { startGateway } from "../../tests/_gateway.ts";
import { startDockerNode } from "../../tests/_docker.ts";
import { freshCheckIn, nodeOf, startSecondEngine } from "../../tests/_heal_fleet.ts";
import { DEFAULT_DOCKER_SOCKET } from "../../node/executors/docker/mod.ts";

const runs = Number(Deno.args[0] ?? 3);
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const engine = await startSecondEngine();
const gw = await startGateway({
  env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100", DORMICE_GATEWAY_NODE_ACTIVE_LIMIT: "1" },
});
const suffix = crypto.randomUUID().slice(0, 6);
const ids = [`bheala-${suffix}`, `bhealb-${suffix}`];
const nodes = await Promise.all(ids.map((id, i) =>
  startDockerNode({
    token: gw.token,
    gatewayUrl: gw.url,
    nodeId: id,
    socket: i === 0 ? DEFAULT_DOCKER_SOCKET : engine.socket,
    env: {
      DORMICE_SNAPSHOT_MIN_DISK_GB: "0",
      DORMICE_TEMPLATES: "base=dormice-minimal:latest,minimal=dormice-minimal:latest",
      ...(i === 1 ? { DORMICE_SANDBOX_HOST_FIREWALL: "off" } : {}),
    },
  })
));
const byId = new Map(ids.map((id, i) => [id, nodes[i]]));
const minted = await gw.json("createApiKey", { team: "bench" });
const opts = {
  apiUrl: `${gw.url}/e2b/api`,
  sandboxUrl: `${gw.url}/e2b/envd`,
  apiKey: minted.body.key,
};
const s = {
  cold: [] as number[],
  holder: [] as number[],
  healed: [] as number[],
  bps: [] as number[],
  bytes: [] as number[],
  healMs: [] as number[],
};
try {
  for (const id of ids) await freshCheckIn(gw, id, `${id} up`, (n) => n.reading !== null);
  for (let i = -1; i < runs; i++) {
    const idle = () =>
      Promise.all(
        ids.map((id) =>
          freshCheckIn(gw, id, `${id} idle`, (n) => n.reading?.sandboxes.active === 0)
        ),
      );
    await idle();
    let t = performance.now();
    const source = await Sandbox.create("minimal", opts);
    const cold = performance.now() - t;
    await source.commands.run("dd if=/dev/urandom of=/home/user/blob bs=1M count=64 2>/dev/null");
    const snap = await source.createSnapshot();
    const holder = await nodeOf(opts, source.sandboxId);
    const other = ids.find((id) => id !== holder)!;
    await source.kill();
    await freshCheckIn(gw, holder, "holder idle", (n) => n.reading?.sandboxes.active === 0);
    t = performance.now();
    const onHolder = await Sandbox.create(snap.snapshotId, opts);
    const holderMs = performance.now() - t;
    await freshCheckIn(gw, holder, "holder full", (n) => (n.reading?.sandboxes.active ?? 0) >= 1);
    const logBefore = byId.get(other)!.process.stderr().length;
    t = performance.now();
    const healed = await Sandbox.create(snap.snapshotId, opts);
    const healedMs = performance.now() - t;
    if ((await nodeOf(opts, healed.sandboxId)) !== other) {
      throw new Error("the heal did not land on the other node");
    }
    const line = byId.get(other)!.process.stderr().slice(logBefore).split("\n")
      .find((l) => l.includes("image healed from another node"));
    if (!line) throw new Error("no heal in the receiver's log");
    const { bytes, ms } = JSON.parse(line) as { bytes: number; ms: number };
    await onHolder.kill();
    await healed.kill();
    await Sandbox.deleteSnapshot(snap.snapshotId, opts);
    if (i < 0) continue; // one warm-up iteration, not counted
    s.cold.push(cold);
    s.holder.push(holderMs);
    s.healed.push(healedMs);
    s.bytes.push(bytes);
    s.healMs.push(ms);
    s.bps.push(bytes / (ms / 1000));
  }
  const ref = median(s.cold);
  const out = [
    `date ${new Date().toISOString().slice(0, 10)}, runs ${runs} (+1 warm-up)`,
    `cold create, minimal (reference): ${median(s.cold).toFixed(0)} ms (1.00)`,
    `create from a snapshot on its holder: ${median(s.holder).toFixed(0)} ms (${
      (median(s.holder) / ref).toFixed(2)
    })`,
    `create from it on another engine, heal included: ${median(s.healed).toFixed(0)} ms (${
      (median(s.healed) / ref).toFixed(2)
    })`,
    `heal alone (save -> HTTP -> load -> relabel): ${median(s.healMs).toFixed(0)} ms for ${
      (median(s.bytes) / 1e6).toFixed(1)
    } MB`,
    `heal rate: ${(median(s.bps) / 1e6).toFixed(1)} MB/s`,
  ];
  console.log(out.join("\n"));
} finally {
  await Promise.all(nodes.map((n) => n.stop()));
  await gw.stop();
  await new Deno.Command("sh", {
    args: [
      "-c",
      ids.map((id) =>
        `docker ps -aq --filter label=dormice.node=${id} | xargs -r docker rm -f; docker images -aq --filter label=dormice.node=${id} | xargs -r docker rmi -f`
      ).join("; "),
    ],
    stdout: "null",
    stderr: "null",
  }).output();
  await engine.stop();
}
