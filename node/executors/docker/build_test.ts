/**
 * Docker template builds on the engine itself: the steps' state (WORKDIR, ENV) reaches later
 * steps and the sandboxes of the template, a COPY of a directory lands relative to the workdir
 * with its mode, a failed pull names the image and the registry, and a build container a stopped
 * node left behind is removed by the next build.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { DockerExecutor } from "./executor.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import { dockerReadiness } from "./_fixtures_test.ts";
import type { BuildIo, TemplateBuildSpec } from "../template_build.ts";

const onCi = Deno.env.get("CI") === "true";
const readiness = await dockerReadiness();
const notReady = readiness.ready ? null : readiness.why;
if (notReady && !onCi) console.log(`docker build_test: skipped: ${notReady}`);

Deno.test({
  name: "DockerExecutor builds a template: state, a copied directory, a failed pull, a sweep",
  ignore: notReady !== null && !onCi,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    if (notReady) throw new Error(`CI=true, so the Docker cases must run, but ${notReady}`);
    const tag = Math.random().toString(36).slice(2, 8);
    const nodeId = `buildunit-${tag}`;
    const instanceId = `b${tag}`;
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    const executor = new DockerExecutor({ nodeId, instanceId });
    const dir = await Deno.makeTempDir();
    try {
      // A build container a stopped node left behind.
      const stray = await docker.createContainer({
        Image: "dormice-minimal:latest",
        Entrypoint: ["sleep"],
        Cmd: ["60"],
        Labels: { "dormice.instance": instanceId, "dormice.build": "stale" },
      });
      await Deno.mkdir(`${dir}/ctx/conf`, { recursive: true });
      await Deno.writeTextFile(`${dir}/ctx/conf/x.txt`, "copied\n");
      const archive = await new Deno.Command("tar", {
        args: ["czf", `${dir}/context.tar.gz`, "-C", `${dir}/ctx`, "conf"],
      }).output();
      assert.ok(archive.success);
      // A hash of this run's own: a step cache image another run left on the engine must not
      // answer for these steps (the log lines below come only from steps that ran).
      const hash = Array.from(
        crypto.getRandomValues(new Uint8Array(32)),
        (b) => b.toString(16).padStart(2, "0"),
      ).join("");
      const lines: string[] = [];
      const io = (): BuildIo => ({
        log: (_level, message) => lines.push(message),
        contextFile: (h) => h === hash ? `${dir}/context.tar.gz` : undefined,
        signal: new AbortController().signal,
      });
      const spec: TemplateBuildSpec = {
        templateId: `snap-${"a".repeat(14)}${tag}`,
        buildId: crypto.randomUUID(),
        team: "t",
        name: "unit",
        fromTemplate: "minimal",
        steps: [
          { type: "WORKDIR", args: ["/opt/app"] },
          { type: "ENV", args: ["GREETING", "hello there"] },
          { type: "COPY", args: ["conf", "conf", "", "0600"], filesHash: hash },
          { type: "RUN", args: ['cat conf/x.txt && echo "$GREETING from $(pwd)"'] },
        ],
        force: false,
        memoryMB: 256,
      };
      const info = await executor.buildTemplate(spec, io());
      assert.equal(info.snapshotId, spec.templateId);
      assert.ok(lines.includes("copied"), lines.join("\n"));
      assert.ok(lines.includes("hello there from /opt/app"), lines.join("\n"));
      await assert.rejects(docker.getContainer(stray.id).inspect(), /no such container/i);
      assert.deepEqual((await executor.listSnapshots("t")).map((s) => s.name), ["unit"]);

      // Another team, the same steps and the same files hash over other files: nothing of the
      // first team's step cache is used.
      await Deno.mkdir(`${dir}/other/conf`, { recursive: true });
      await Deno.writeTextFile(`${dir}/other/conf/x.txt`, "other team\n");
      const otherArchive = await new Deno.Command("tar", {
        args: ["czf", `${dir}/other.tar.gz`, "-C", `${dir}/other`, "conf"],
      }).output();
      assert.ok(otherArchive.success);
      const otherLines: string[] = [];
      await executor.buildTemplate({
        ...spec,
        templateId: `snap-${"b".repeat(14)}${tag}`,
        buildId: crypto.randomUUID(),
        team: "u",
      }, {
        log: (_level, message) => otherLines.push(message),
        contextFile: (h) => h === hash ? `${dir}/other.tar.gz` : undefined,
        signal: new AbortController().signal,
      });
      assert.ok(otherLines.includes("other team"), otherLines.join("\n"));
      assert.ok(!otherLines.some((l) => l.includes("CACHED")), otherLines.join("\n"));

      await executor.create({
        id: "s1",
        name: "s1",
        template: "minimal",
        spec: { memoryMB: 96 },
        env: {},
        snapshot: spec.templateId,
      });
      const run = async (cmd: string) => {
        const handle = await executor.exec("s1", { cmd: ["/bin/sh", "-c", cmd] });
        const [out] = await Promise.all([new Response(handle.stdout).text(), handle.exited]);
        return out;
      };
      assert.equal(await run('echo "$GREETING"; pwd'), "hello there\n/opt/app\n");
      assert.equal(await run("stat -c %a /opt/app/conf/x.txt"), "600\n");
      await executor.destroy("s1");

      const pull = await executor.buildTemplate({
        ...spec,
        buildId: crypto.randomUUID(),
        fromTemplate: undefined,
        fromImage: "registry.invalid/none/image:1",
        steps: [],
      }, io()).catch((e) => e);
      assert.equal(pull.step, "base");
      assert.match(pull.message, /registry\.invalid\/none\/image:1/);
      assert.match(pull.message, /could not be pulled from registry\.invalid/);
    } finally {
      await executor.destroy("s1").catch(() => {});
      await executor.close();
      for (
        const c of await docker.listContainers({
          all: true,
          filters: { label: [`dormice.instance=${instanceId}`] },
        })
      ) {
        await docker.getContainer(c.Id).remove({ force: true }).catch(() => {});
      }
      const images = await docker.listImages({
        filters: { label: [`dormice.instance=${instanceId}`] },
      });
      // Newest first: a step cache image is the parent of the next step's.
      for (
        const image of images.sort((x: { Created: number }, y: { Created: number }) =>
          y.Created - x.Created
        )
      ) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "DockerExecutor builds a COPY of files with symlinks: each lands as the link it is",
  ignore: notReady !== null && !onCi,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    if (notReady) throw new Error(`CI=true, so the Docker cases must run, but ${notReady}`);
    const tag = Math.random().toString(36).slice(2, 8);
    const instanceId = `l${tag}`;
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    const executor = new DockerExecutor({ nodeId: `buildlink-${tag}`, instanceId });
    const dir = await Deno.makeTempDir();
    try {
      // What the SDK uploads for `copy('folder/*', 'folder')` over the folder its own build test
      // makes: a file, a relative link to it, an absolute link to it (dangling in the build
      // container: the path is the client's) and a link to nothing.
      await Deno.mkdir(`${dir}/ctx/folder`, { recursive: true });
      await Deno.writeTextFile(`${dir}/ctx/folder/test.txt`, "This is a test file.");
      await Deno.symlink("test.txt", `${dir}/ctx/folder/symlink.txt`);
      await Deno.symlink(`${dir}/ctx/folder/test.txt`, `${dir}/ctx/folder/symlink2.txt`);
      await Deno.symlink("12345test.txt", `${dir}/ctx/folder/symlink3.txt`);
      const archive = await new Deno.Command("tar", {
        args: ["czf", `${dir}/context.tar.gz`, "-C", `${dir}/ctx`, "folder"],
      }).output();
      assert.ok(archive.success);
      const hash = Array.from(
        crypto.getRandomValues(new Uint8Array(32)),
        (b) => b.toString(16).padStart(2, "0"),
      ).join("");
      const lines: string[] = [];
      const spec: TemplateBuildSpec = {
        templateId: `snap-${"c".repeat(14)}${tag}`,
        buildId: crypto.randomUUID(),
        team: "t",
        name: "links",
        fromTemplate: "minimal",
        steps: [
          { type: "WORKDIR", args: ["/opt/app"] },
          // A mode too: it is the files', never a link's target's.
          { type: "COPY", args: ["folder/*", "folder", "", "0640"], filesHash: hash },
          {
            type: "RUN",
            args: [
              "cat folder/symlink.txt; echo; readlink folder/symlink3.txt; " +
              "readlink folder/symlink2.txt; stat -c %a folder/test.txt",
            ],
          },
        ],
        force: true,
        memoryMB: 256,
      };
      await executor.buildTemplate(spec, {
        log: (_level, message) => lines.push(message),
        contextFile: (h) => h === hash ? `${dir}/context.tar.gz` : undefined,
        signal: new AbortController().signal,
      });
      const at = lines.indexOf("This is a test file.");
      assert.ok(at >= 0, lines.join("\n"));
      assert.deepEqual(
        lines.slice(at, at + 4),
        ["This is a test file.", "12345test.txt", `${dir}/ctx/folder/test.txt`, "640"],
      );
    } finally {
      await executor.close();
      for (
        const c of await docker.listContainers({
          all: true,
          filters: { label: [`dormice.instance=${instanceId}`] },
        })
      ) {
        await docker.getContainer(c.Id).remove({ force: true }).catch(() => {});
      }
      const images = await docker.listImages({
        filters: { label: [`dormice.instance=${instanceId}`] },
      });
      for (
        const image of images.sort((x: { Created: number }, y: { Created: number }) =>
          y.Created - x.Created
        )
      ) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "DockerExecutor fails a RUN as a user the image lacks naming the user, as E2B does",
  ignore: notReady !== null && !onCi,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    if (notReady) throw new Error(`CI=true, so the Docker cases must run, but ${notReady}`);
    const tag = Math.random().toString(36).slice(2, 8);
    const instanceId = `u${tag}`;
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    const executor = new DockerExecutor({ nodeId: `builduser-${tag}`, instanceId });
    try {
      const spec: TemplateBuildSpec = {
        templateId: `snap-${"d".repeat(14)}${tag}`,
        buildId: crypto.randomUUID(),
        team: "t",
        name: "users",
        fromTemplate: "minimal",
        steps: [
          { type: "RUN", args: ['test "$(whoami)" = root', "root"] },
          { type: "RUN", args: ["whoami", "root123"] },
        ],
        force: true,
        memoryMB: 256,
      };
      const error = await executor.buildTemplate(spec, {
        log: () => {},
        contextFile: () => undefined,
        signal: new AbortController().signal,
      }).catch((e) => e);
      assert.equal(error.step, "2", String(error));
      // The SDK's own runCmd test expects these words.
      assert.ok(
        error.message.includes(
          "failed to run command 'whoami': command failed: unauthenticated: invalid username: " +
            "'root123'",
        ),
        error.message,
      );
    } finally {
      await executor.close();
      for (
        const c of await docker.listContainers({
          all: true,
          filters: { label: [`dormice.instance=${instanceId}`] },
        })
      ) {
        await docker.getContainer(c.Id).remove({ force: true }).catch(() => {});
      }
      const images = await docker.listImages({
        filters: { label: [`dormice.instance=${instanceId}`] },
      });
      for (
        const image of images.sort((x: { Created: number }, y: { Created: number }) =>
          y.Created - x.Created
        )
      ) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
    }
  },
});
