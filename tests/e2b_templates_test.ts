/**
 * Templates built with the official `e2b` SDK's `Template()` builder, unmodified, through a real
 * gateway in front of two real nodes: the build's log lines reach `onBuildLogs`, the template
 * is found by name by its team only, sandboxes start from it (with the copied file, the
 * environment and the start command on Docker), a failing step is a `BuildError` naming it, an
 * image no registry serves fails naming the registry, a rebuild with only its last step changed
 * reruns only that step (Docker), another team cannot use or see it until it is published
 * (`PATCH /v2/templates/{id}`), only its team deletes it, and a delete removes it fleet-wide. On the fake executor and on Docker; off CI the Docker run skips with a printed
 * reason when there is no engine, with `CI=true` it fails.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { BuildError, Sandbox, Template } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import { writeTar } from "../node/executors/docker/_tar.ts";
import { startNode } from "./_processes.ts";
import { nodeOf, sdkOptions, startTwoNodeFleet, type TwoNodeFleet } from "./_two_nodes.ts";
import { dockerGate, removeContainersOf, startDockerNode, until } from "./_docker.ts";

type Opts = ReturnType<typeof sdkOptions>;

/** A file context directory with `hello.txt`. */
async function context(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-tpl-ctx-" });
  await Deno.writeTextFile(`${dir}/hello.txt`, "hello from the context\n");
  return dir;
}

/** The node a sandbox runs on. */
async function exam(t: Deno.TestContext, fleet: TwoNodeFleet, docker: boolean): Promise<void> {
  const { gw } = fleet;
  const key = async (team: string) => {
    const minted = await gw.json("createApiKey", { team });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    return sdkOptions(gw.url, minted.body.key);
  };
  const a = await key("team-a");
  const b = await key("team-b");
  const dir = await context();
  const name = `tpl-${crypto.randomUUID().slice(0, 8)}`;
  const made: Sandbox[] = [];
  let templateId = "";
  // The first command is new to the engine, so the first build caches nothing before it.
  const template = (last: string) =>
    Template({ fileContextPath: dir })
      .fromTemplate("base")
      .runCmd(`echo built-as-$(id -un) > /tmp/who && echo step-one-done # ${name}`, {
        user: "root",
      })
      .copy("hello.txt", "/home/user/hello.txt", { mode: 0o640 })
      .setEnvs({ GREETING: "hi-from-template" })
      .runCmd(last, { user: "root" });
  try {
    await t.step("Template.build from base: logs reach onBuildLogs", async () => {
      const lines: string[] = [];
      const built = await Template.build(
        template("echo last-step-v1").setStartCmd(
          "echo started > /tmp/started && sleep 3600",
          "test -f /tmp/started",
        ),
        name,
        { ...a, onBuildLogs: (entry) => lines.push(entry.message) },
      );
      templateId = built.templateId;
      assert.match(templateId, /^snap-[a-z0-9]{20}$/);
      const text = lines.join("\n");
      assert.match(text, /step-one-done/, text);
      assert.match(text, /last-step-v1/, text);
      assert.ok(await Template.exists(name, a), "the team finds its template by name");
      assert.equal(await Template.exists(name, b), false, "another team does not");
    });

    await t.step("the SDK's exists, getTags, buildInBackground and getBuildStatus", async () => {
      // As the SDK's own exists test: the fleet's base template exists, a random name does not.
      assert.equal(await Template.exists("base", a), true);
      assert.equal(await Template.exists(`nonexistent-${crypto.randomUUID()}`, a), false);
      const tags = await Template.getTags(templateId, a);
      assert.deepEqual(tags.map((x) => x.tag), ["default"]);
      const background = await Template.buildInBackground(
        Template().fromTemplate("base").runCmd("echo in-background"),
        { alias: `${name}-bg`, cpuCount: 1, memoryMB: 1024, ...a },
      );
      let status = await Template.getBuildStatus(background, a);
      await until("the background build ends", async () => {
        status = await Template.getBuildStatus(background, a);
        return status.status !== "building";
      });
      assert.equal(status.status, "ready", JSON.stringify(status.reason));
      const all = await Template.getBuildStatus(background, { ...a, logsOffset: 0 });
      assert.ok(all.logEntries.some((l) => l.message === "in-background"));
      const del = await fetch(`${a.apiUrl}/templates/${background.templateId}`, {
        method: "DELETE",
        headers: { "x-api-key": a.apiKey },
      });
      assert.equal(del.status, 204);
      await del.body?.cancel();
    });

    await t.step("Sandbox.create(name) starts from it, on either node", async () => {
      const nodes = new Set<string>();
      for (let i = 0; i < (docker ? 2 : 3); i++) {
        const sbx = await Sandbox.create(name, a);
        made.push(sbx);
        nodes.add(await nodeOf(a, sbx.sandboxId));
        if (docker) {
          assert.equal(await sbx.files.read("/home/user/hello.txt"), "hello from the context\n");
          const env = await sbx.commands.run("echo $GREETING; cat /tmp/who /tmp/started");
          assert.equal(env.stdout, "hi-from-template\nbuilt-as-root\nstarted\n");
          const mode = await sbx.commands.run("stat -c %a /home/user/hello.txt");
          assert.equal(mode.stdout.trim(), "640");
        }
      }
      // Until image movement between nodes, the builder holds the template and takes them all.
      assert.equal(nodes.size, 1, `sandboxes of a built template ran on ${[...nodes]}`);
    });

    await t.step("fromTemplate of the team's own template builds where that one is", async () => {
      // The sandboxes of the step before run on the holder, so placement alone would put these
      // builds on the other node, which lacks their base.
      for (let i = 0; i < 3; i++) {
        const child = await Template.build(
          Template().fromTemplate(name)
            // The fake's shell has no `test`, and its COPY keeps no files.
            .runCmd(docker ? "test -f /home/user/hello.txt" : "echo child"),
          `${name}-child${i}`,
          a,
        );
        const del = await fetch(`${a.apiUrl}/templates/${child.templateId}`, {
          method: "DELETE",
          headers: { "x-api-key": a.apiKey },
        });
        assert.equal(del.status, 204);
        await del.body?.cancel();
      }
      // A build that moved to its base's holder spent the upload URL of the node first chosen.
      const api = async (method: string, path: string, body?: unknown) => {
        const res = await fetch(`${a.apiUrl}${path}`, {
          method,
          headers: { "x-api-key": a.apiKey, "content-type": "application/json" },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        return { status: res.status, body: await res.json() };
      };
      const req = await api("POST", "/v3/templates", { name: `${name}-moved` });
      assert.equal(req.status, 202, JSON.stringify(req.body));
      const { templateID, buildID } = req.body;
      const tar = gzip(writeTar([{ name: "a.txt", type: "file", data: new Uint8Array([97]) }]));
      const url = (await api("GET", `/templates/${templateID}/files/${"f".repeat(64)}`)).body.url;
      const started = await api("POST", `/v2/templates/${templateID}/builds/${buildID}`, {
        fromTemplate: name,
        steps: [{ type: "RUN", args: ["echo moved"] }],
      });
      assert.equal(started.status, 202, JSON.stringify(started.body));
      const spent = await fetch(url, { method: "PUT", body: (await tar) as BodyInit });
      assert.equal(spent.status, 403, "the upload URL is spent once the build started");
      assert.match((await spent.json()).message, /its build has started/);
      await until("the moved build ends", async () => {
        const st = await api("GET", `/templates/${templateID}/builds/${buildID}/status`);
        return st.body.status === "ready";
      });
      const gone = await fetch(`${a.apiUrl}/templates/${templateID}`, {
        method: "DELETE",
        headers: { "x-api-key": a.apiKey },
      });
      await gone.body?.cancel();
    });

    await t.step("another team cannot start, list or read its builds", async () => {
      await assert.rejects(Sandbox.create(name, b));
      const listed = await fetch(`${b.apiUrl}/templates`, { headers: { "x-api-key": b.apiKey } });
      assert.equal(listed.status, 200);
      assert.ok(!(await listed.text()).includes(templateId));
      const mine = await fetch(`${a.apiUrl}/templates`, { headers: { "x-api-key": a.apiKey } });
      assert.ok((await mine.text()).includes(templateId));
    });

    await t.step("published, every team starts from it; only its team deletes it", async () => {
      const patch = (opts: Opts, value: boolean) =>
        fetch(`${opts.apiUrl}/v2/templates/${templateId}`, {
          method: "PATCH",
          headers: { "x-api-key": opts.apiKey, "content-type": "application/json" },
          body: JSON.stringify({ public: value }),
        });
      const other = await patch(b, true);
      assert.equal(other.status, 404, "another team cannot publish it");
      await other.body?.cancel();
      const res = await patch(a, true);
      assert.equal(res.status, 200);
      assert.deepEqual(await res.json(), { names: [name] });
      assert.ok(await Template.exists(name, b), "another team finds a published template");
      const sbx = await Sandbox.create(name, b);
      made.push(sbx);
      if (docker) {
        assert.equal(await sbx.files.read("/home/user/hello.txt"), "hello from the context\n");
      }
      await sbx.kill();
      const del = await fetch(`${b.apiUrl}/templates/${templateId}`, {
        method: "DELETE",
        headers: { "x-api-key": b.apiKey },
      });
      assert.equal(del.status, 404, "another team cannot delete a published template");
      await del.body?.cancel();
      const back = await patch(a, false);
      assert.equal(back.status, 200);
      await back.body?.cancel();
      assert.equal(await Template.exists(name, b), false, "unpublished, it is the team's again");
      await assert.rejects(Sandbox.create(name, b));
    });

    await t.step("bad input is a clear 4xx in E2B's shape", async () => {
      const call = async (method: string, path: string, body?: unknown, key = a.apiKey) => {
        const res = await fetch(`${a.apiUrl}${path}`, {
          method,
          headers: { "x-api-key": key, "content-type": "application/json" },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        const text = await res.text();
        return { status: res.status, body: text ? JSON.parse(text) : null };
      };
      const noName = await call("POST", "/v3/templates", {});
      assert.equal(noName.status, 400);
      assert.match(noName.body.message, /'name' is required/);
      const badName = await call("POST", "/v3/templates", { name: "no spaces please" });
      assert.equal(badName.status, 400);
      assert.match(badName.body.message, /letters, digits/);
      const fleetName = await call("POST", "/v3/templates", { name: "base" });
      assert.equal(fleetName.status, 409);
      assert.match(fleetName.body.message, /template of the fleet/);
      const req = await call("POST", "/v3/templates", { name: `${name}-input` });
      assert.equal(req.status, 202);
      const { templateID, buildID } = req.body;
      const badHash = await call("GET", `/templates/${templateID}/files/not-a-hash`);
      assert.equal(badHash.status, 400);
      assert.match(badHash.body.message, /64 hex digits/);
      const files = await call("GET", `/templates/${templateID}/files/${"c".repeat(64)}`);
      assert.equal(files.status, 200);
      assert.equal(files.body.present, false);
      assert.ok(files.body.url.startsWith(`${a.apiUrl}/templates/${templateID}/files/`));
      const proxied = await fetch(`${a.apiUrl}/templates/${templateID}/files/${"c".repeat(64)}`, {
        headers: { "x-api-key": a.apiKey, "x-forwarded-proto": "https" },
      });
      assert.match((await proxied.json()).url, /^https:\/\//, "the proxy's scheme");
      const forgedUrl = files.body.url.replace(/\.[A-Za-z0-9_-]{43}$/, `.${"A".repeat(43)}`);
      assert.notEqual(forgedUrl, files.body.url, "the forged URL's signature differs");
      const forged = await fetch(forgedUrl, {
        method: "PUT",
        body: "x",
      });
      assert.equal(forged.status, 403);
      await forged.body?.cancel();
      const otherTeam = await call(
        "GET",
        `/templates/${templateID}/builds/${buildID}/status`,
        undefined,
        b.apiKey,
      );
      assert.equal(otherTeam.status, 404, "another team's build is not found");
      const unknownBase = await call("POST", `/v2/templates/${templateID}/builds/${buildID}`, {
        fromTemplate: "no-such-template",
        steps: [],
      });
      assert.equal(unknownBase.status, 400);
      assert.match(unknownBase.body.message, /no-such-template/);
      const badOffset = await call(
        "GET",
        `/templates/${templateID}/builds/${buildID}/status?logsOffset=-1`,
      );
      assert.equal(badOffset.status, 400);
      assert.match(badOffset.body.message, /'logsOffset' must be a whole number/);
      const unknownBuild = await call("GET", `/templates/snap-${"x".repeat(20)}/builds/b/status`);
      assert.equal(unknownBuild.status, 404);
      assert.match(unknownBuild.body.message, /POST \/v3\/templates/);
    });

    await t.step(
      "hostile input: odd escapes, one name built twice at once, a spent upload URL",
      async () => {
        const call = async (method: string, path: string, body?: unknown) => {
          const res = await fetch(`${a.apiUrl}${path}`, {
            method,
            headers: { "x-api-key": a.apiKey, "content-type": "application/json" },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
          const text = await res.text();
          return { status: res.status, body: text ? JSON.parse(text) : null };
        };
        for (const path of ["/templates/aliases/%E0%A4%A", "/templates/%E0%A4%A/tags"]) {
          const odd = await call("GET", path);
          assert.equal(odd.status, 400, `${path}: ${JSON.stringify(odd.body)}`);
          assert.match(odd.body.message, /malformed %-escape/);
        }
        for (const body of [{ name: "a:b:c" }, { name: "a:" }, { name: "a:bad tag" }]) {
          const odd = await call("POST", "/v3/templates", body);
          assert.equal(odd.status, 400, `${JSON.stringify(body)}: ${JSON.stringify(odd.body)}`);
          assert.match(odd.body.message, /'name' .* must be 1 to 64 letters/);
        }
        const badTag = await call("POST", "/v3/templates", {
          name: `${name}-t`,
          tags: ["no/slash"],
        });
        assert.equal(badTag.status, 400);
        assert.match(badTag.body.message, /Tag 'no\/slash'/);
        // Two builds of one new name at once: one template, each build's status readable.
        const twice = `${name}-twice`;
        const [one, two] = await Promise.all([
          call("POST", "/v3/templates", { name: twice }),
          call("POST", "/v3/templates", { name: twice }),
        ]);
        assert.equal(one.status, 202);
        assert.equal(two.status, 202);
        assert.equal(one.body.templateID, two.body.templateID, "one template, not two");
        assert.notEqual(one.body.buildID, two.body.buildID);
        const id = one.body.templateID;
        const files = await call("GET", `/templates/${id}/files/${"d".repeat(64)}`);
        assert.equal(files.status, 200);
        for (const r of [one, two]) {
          const started = await call("POST", `/v2/templates/${id}/builds/${r.body.buildID}`, {
            fromTemplate: "base",
            steps: [],
          });
          assert.equal(started.status, 202, JSON.stringify(started.body));
        }
        for (const r of [one, two]) {
          await until(`build ${r.body.buildID} ends`, async () => {
            const status = await call("GET", `/templates/${id}/builds/${r.body.buildID}/status`);
            assert.equal(status.status, 200, JSON.stringify(status.body));
            return status.body.status === "ready";
          });
        }
        const past = await call(
          "GET",
          `/templates/${id}/builds/${one.body.buildID}/status?logsOffset=999999999`,
        );
        assert.equal(past.status, 200);
        assert.deepEqual(past.body.logEntries, []);
        // 1000 steps is past the bound of a build's steps: a 400, nothing started.
        const many = await call("POST", "/v3/templates", { name: `${name}-many` });
        const steps = Array.from({ length: 1000 }, () => ({ type: "RUN", args: ["true"] }));
        const tooMany = await call(
          "POST",
          `/v2/templates/${many.body.templateID}/builds/${many.body.buildID}`,
          { fromTemplate: "base", steps },
        );
        assert.equal(tooMany.status, 400, JSON.stringify(tooMany.body));
        assert.match(tooMany.body.message, /steps/);
        // Both builds sent their steps: the upload URL is spent.
        const spent = await fetch(files.body.url, { method: "PUT", body: "x" });
        assert.equal(spent.status, 403);
        assert.match((await spent.json()).message, /its build has started/);
        const listed = await call("GET", "/templates");
        assert.equal(
          listed.body.filter((x: { names: string[] }) => x.names.includes(twice)).length,
          1,
          "the name lists once",
        );
      },
    );

    await t.step("a failing step is a BuildError naming the step, with its output", async () => {
      const error = await Template.build(
        Template().fromTemplate("base").runCmd("echo first").runCmd("echo boom-output; exit 3"),
        `${name}-bad`,
        a,
      ).catch((e) => e);
      assert.ok(error instanceof BuildError, String(error));
      assert.match(error.message, /Step 2 failed/);
      assert.match(error.message, /exited with code 3/);
      assert.match(error.message, /boom-output/);
    });

    await t.step(
      "fromImage of an image no registry serves names the image and registry",
      async () => {
        const error = await Template.build(
          Template().fromImage("example.invalid/nope/none:1").runCmd("true"),
          `${name}-img`,
          a,
        ).catch((e) => e);
        assert.ok(error instanceof BuildError, String(error));
        assert.match(error.message, /example\.invalid\/nope\/none:1/);
        assert.match(error.message, /could not be pulled/);
      },
    );

    if (docker) {
      await t.step("a rebuild with the last step changed reruns only that step", async () => {
        const lines: string[] = [];
        const again = await Template.build(template("echo last-step-v2"), name, {
          ...a,
          onBuildLogs: (entry) => lines.push(entry.message),
        });
        assert.equal(again.templateId, templateId, "the same name keeps its id");
        const text = lines.join("\n");
        assert.match(text, /\[1\] CACHED/, text);
        assert.match(text, /\[2\] CACHED/, text);
        // The first step's output line; its command (in the CACHED line) says it too.
        assert.ok(!lines.includes("step-one-done"), text);
        assert.match(text, /last-step-v2/, text);
        const sbx = await Sandbox.create(name, a);
        made.push(sbx);
        assert.equal((await sbx.commands.run("cat /home/user/hello.txt")).exitCode, 0);
      });
    }

    await t.step("delete removes it fleet-wide", async () => {
      for (const s of made.splice(0)) await s.kill().catch(() => {});
      const other = await fetch(`${b.apiUrl}/templates/${templateId}`, {
        method: "DELETE",
        headers: { "x-api-key": b.apiKey },
      });
      assert.equal(other.status, 404, "another team cannot delete it");
      await other.body?.cancel();
      const res = await fetch(`${a.apiUrl}/templates/${templateId}`, {
        method: "DELETE",
        headers: { "x-api-key": a.apiKey },
      });
      assert.equal(res.status, 204, await res.text());
      await until("the template is gone", async () => !(await Template.exists(name, a)));
      await assert.rejects(Sandbox.create(name, a));
    });
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test({
  name: "e2b SDK Template builds through a gateway in front of two fake nodes",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const fleet = await startTwoNodeFleet(
    (gw, id) =>
      startNode({
        token: gw.token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: gw.url,
          DORMICE_NODE_ID: id,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        },
      }),
    ["tpl-fake-a", "tpl-fake-b"],
  );
  try {
    await exam(t, fleet, false);
  } finally {
    await fleet.stop();
  }
});

const gate = await dockerGate("docker template build suite");

Deno.test({
  name: "e2b SDK Template builds through a gateway in front of two Docker nodes",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const ids: [string, string] = [
    `tpla-${crypto.randomUUID().slice(0, 6)}`,
    `tplb-${crypto.randomUUID().slice(0, 6)}`,
  ];
  const fleet = await startTwoNodeFleet(
    (gw, id) => startDockerNode({ token: gw.token, gatewayUrl: gw.url, nodeId: id }),
    ids,
  );
  try {
    await exam(t, fleet, true);
  } finally {
    await fleet.stop();
    await removeContainersOf(ids);
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    for (const id of ids) {
      const images = await docker.listImages({ filters: { label: [`dormice.node=${id}`] } });
      // Newest first: a step cache image is the parent of the next step's.
      images.sort((x: { Created: number }, y: { Created: number }) => y.Created - x.Created);
      for (const image of images) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
    }
  }
});

/** `bytes` gzipped, as the SDK uploads a context. */
async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([bytes as BlobPart]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
