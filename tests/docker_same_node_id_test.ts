/**
 * Two nodes with the same node id on one Docker engine, each with its own data dir: what two
 * copies of `deno task fleet` (both naming their nodes `node-a`, `node-b`) are. The second's boot
 * must not take the first's containers for orphans of its own and remove them; each owns its
 * containers by the instance id its ledger minted, not by the node id both share.
 *
 * Needs an engine and the images: with `CI=true` it never skips; off CI it skips with a printed
 * reason.
 */
import assert from "node:assert/strict";
import {
  containersOf,
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";

const gate = await dockerGate("docker same-node-id suite");

async function native(node: DockerNodeProcess, verb: string, body: unknown) {
  const res = await fetch(`${node.url}/${verb}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${node.token}` },
    body: JSON.stringify(body),
  });
  // deno-lint-ignore no-explicit-any
  return { status: res.status, body: await res.json() as any };
}

Deno.test({
  name: "docker: a second node with the same id and another data dir leaves the first's sandboxes",
  ignore: gate.skip,
  // Child processes and dockerode's pooled unix sockets outlive single steps by design.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const nodeId = `dktwin-${crypto.randomUUID().slice(0, 8)}`;
  let first: DockerNodeProcess | undefined;
  let second: DockerNodeProcess | undefined;
  try {
    first = await startDockerNode({ nodeId });
    const made = await native(first, "acquireSandbox", { name: "kept", template: "minimal" });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    const id: string = made.body.sandbox.id;
    assert.deepEqual(await containersOf(nodeId), [id], "the precondition: its container exists");

    // The second boots (its reconcile runs before it answers /healthz) beside the first.
    second = await startDockerNode({ nodeId, token: first.token });
    const removals = second.process.stderr().split("\n").filter((l) => /ledger row/.test(l));
    assert.deepEqual(removals, [], "the second node removed nothing");
    assert.deepEqual(await containersOf(nodeId), [id], "the first's container is still there");
    const ran = await native(first, "execCommand", { name: "kept", command: "echo still here" });
    assert.equal(ran.status, 200, JSON.stringify(ran.body));
    assert.equal(ran.body.stdout, "still here\n");

    // Each sees only its own: the second has no sandbox, and makes its own without trouble.
    const listed = await native(second, "listSandboxes", {});
    assert.deepEqual(listed.body.sandboxes, []);
    const own = await native(second, "acquireSandbox", { name: "kept", template: "minimal" });
    assert.equal(own.status, 200, JSON.stringify(own.body));
    assert.notEqual(own.body.sandbox.id, id);

    // The second's stop (and its network's removal) leaves the first serving.
    await second.stop();
    second = undefined;
    const after = await native(first, "execCommand", { name: "kept", command: "echo and now" });
    assert.equal(after.status, 200, JSON.stringify(after.body));
    assert.equal(after.body.stdout, "and now\n");
  } finally {
    await second?.stop();
    await first?.stop();
    await removeContainersOf([nodeId]);
  }
});
