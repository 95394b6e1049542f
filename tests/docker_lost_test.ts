/**
 * A sandbox's container removed behind the node's back (`docker rm -f` while the node runs, or
 * while it is down): a real node process on the Docker executor notices on use and at boot,
 * marks the row stopped and answers 410 saying what happened, in each face's dialect.
 *
 * Needs an engine and the base image: with `CI=true` it never skips; off CI it skips with a
 * printed reason.
 */
import assert from "node:assert/strict";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";

const gate = await dockerGate("docker lost-container suite");

/** `docker rm -f` of one sandbox's container, as an operator would type it. */
async function dockerRm(nodeId: string, sandboxId: string): Promise<void> {
  const out = await new Deno.Command("docker", {
    args: ["rm", "-f", `dormice-${nodeId}-${sandboxId}`],
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
}

interface Answer {
  status: number;
  // deno-lint-ignore no-explicit-any
  body: any;
}

async function post(url: string, path: string, body: unknown, headers: Record<string, string>) {
  const res = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : {} } as Answer;
}

Deno.test({
  name: "docker: a container removed behind the node's back is noticed, marked and answered 410",
  ignore: gate.skip,
  // Child processes and dockerode's pooled unix sockets outlive single steps by design.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const nodeId = `dklost-${crypto.randomUUID().slice(0, 8)}`;
  let node: DockerNodeProcess | undefined;
  try {
    node = await startDockerNode({ nodeId });
    const n = node;
    const native = (verb: string, body: unknown) =>
      post(n.url, `/${verb}`, body, { authorization: `Bearer ${n.token}` });
    const make = async (name: string) => {
      const r = await native("acquireSandbox", { name, template: "minimal" });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return r.body.sandbox.id as string;
    };
    const lostSentence = (name: string) =>
      new RegExp(
        `^Sandbox '${name}' lost its docker sandbox, with its files and processes \\(the ` +
          `Docker engine on \\S+ has no container dormice-${nodeId}-[a-z0-9]+ .*removed outside ` +
          "the node, e.g. by docker rm.*\\): destroy it .*then create it again$",
      );

    await t.step(
      "execCommand: 410 naming the missing container; the row says stopped",
      async () => {
        const id = await make("by-exec");
        await dockerRm(nodeId, id);
        const r = await native("execCommand", { name: "by-exec", command: "true" });
        assert.equal(r.status, 410, JSON.stringify(r.body));
        assert.match(r.body.message, lostSentence("by-exec"));
        const found = await native("lookupSandbox", { name: "by-exec" });
        assert.deepEqual(found.body, {
          found: true,
          sandbox: { id, name: "by-exec", state: "stopped", team: "default" },
        });
        // Reported once, when noticed.
        assert.match(n.process.stderr(), new RegExp(`sandbox lost: .*"id":"${id}"`));
        // Every later call names the same cause: the node never restarted.
        const again = await native("execCommand", { name: "by-exec", command: "true" });
        assert.equal(again.status, 410);
        assert.match(again.body.message, lostSentence("by-exec"));
      },
    );

    await t.step("acquireSandbox of an active row asks the engine: 410, not ready", async () => {
      const id = await make("by-acquire");
      await dockerRm(nodeId, id);
      const r = await native("acquireSandbox", { name: "by-acquire" });
      assert.equal(r.status, 410, JSON.stringify(r.body));
      assert.match(r.body.message, lostSentence("by-acquire"));
    });

    await t.step("writeFile names the missing container, not the image", async () => {
      const id = await make("by-write");
      await dockerRm(nodeId, id);
      const r = await native("writeFile", { name: "by-write", path: "/tmp/a", content: "x" });
      assert.equal(r.status, 410, JSON.stringify(r.body));
      assert.match(r.body.message, lostSentence("by-write"));
      assert.doesNotMatch(r.body.message, /fix the image/);
    });

    await t.step("the E2B faces answer in their dialects", async () => {
      const created = await post(n.url, "/e2b/api/sandboxes", {
        templateID: "minimal",
        metadata: { name: "by-e2b" },
      }, { "x-api-key": n.token });
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const { sandboxID, envdAccessToken } = created.body;
      await dockerRm(nodeId, sandboxID);
      const stat = await post(n.url, "/e2b/envd/filesystem.Filesystem/Stat", { path: "/" }, {
        "e2b-sandbox-id": sandboxID,
        "x-access-token": envdAccessToken,
      });
      assert.equal(stat.body.code, "failed_precondition", JSON.stringify(stat.body));
      assert.match(stat.body.message, /lost its docker sandbox/);
      const connect = await post(n.url, `/e2b/api/sandboxes/${sandboxID}/connect`, {
        timeout: 60,
      }, { "x-api-key": n.token });
      assert.equal(connect.status, 410, JSON.stringify(connect.body));
      assert.equal(connect.body.code, 410);
    });

    await t.step("destroy removes the row; the name can be built again", async () => {
      for (const name of ["by-exec", "by-acquire", "by-write", "by-e2b"]) {
        const r = await native("destroySandbox", { name });
        assert.deepEqual(r.body, { destroyed: true }, name);
      }
      const fresh = await native("acquireSandbox", { name: "by-exec", template: "minimal" });
      assert.equal(fresh.body.created, true, JSON.stringify(fresh.body));
      const ran = await native("execCommand", { name: "by-exec", command: "echo back" });
      assert.equal(ran.body.stdout, "back\n");
    });

    await t.step("removed while the node was down: marked at boot, 410 on the wake", async () => {
      const id = (await native("lookupSandbox", { name: "by-exec" })).body.sandbox.id;
      const { dataDir, port, token } = n;
      await n.process.stop();
      await dockerRm(nodeId, id);
      node = await startDockerNode({ nodeId, dataDir, port, token });
      assert.match(node.process.stderr(), new RegExp(`sandbox lost: .*"id":"${id}"`));
      const r = await native("execCommand", { name: "by-exec", command: "true" });
      assert.equal(r.status, 410, JSON.stringify(r.body));
      assert.match(r.body.message, /lost its docker sandbox.*missing when the node started/);
    });
  } finally {
    await node?.stop();
    if (node) await Deno.remove(node.dataDir, { recursive: true }).catch(() => {});
    await removeContainersOf([nodeId]);
  }
});
