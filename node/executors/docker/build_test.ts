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
import { dockerSuite } from "./_fixtures_test.ts";
import {
  collectingIo,
  execOutput,
  packContext,
  removeInstanceLeftovers,
  runFilesHash,
  runTag,
} from "./_build_fixtures_test.ts";
import type { TemplateBuildSpec } from "../template_build.ts";

const dockerTest = await dockerSuite("build_test");

dockerTest(
  "DockerExecutor builds a template: state, a copied directory, a failed pull, a sweep",
  async () => {
    const tag = runTag();
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
      await packContext(`${dir}/ctx`, "conf", `${dir}/context.tar.gz`);
      // The log lines below come only from steps that ran.
      const hash = runFilesHash();
      const lines: string[] = [];
      const io = () => collectingIo(lines, { [hash]: `${dir}/context.tar.gz` });
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
      await packContext(`${dir}/other`, "conf", `${dir}/other.tar.gz`);
      const otherLines: string[] = [];
      await executor.buildTemplate({
        ...spec,
        templateId: `snap-${"b".repeat(14)}${tag}`,
        buildId: crypto.randomUUID(),
        team: "u",
      }, collectingIo(otherLines, { [hash]: `${dir}/other.tar.gz` }));
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
      const run = (cmd: string) => execOutput(executor, "s1", ["/bin/sh", "-c", cmd]);
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
      await removeInstanceLeftovers(instanceId);
      await Deno.remove(dir, { recursive: true });
    }
  },
);

dockerTest(
  "DockerExecutor builds a COPY of files with symlinks: each lands as the link it is",
  async () => {
    const tag = runTag();
    const instanceId = `l${tag}`;
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
      await packContext(`${dir}/ctx`, "folder", `${dir}/context.tar.gz`);
      const hash = runFilesHash();
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
      await executor.buildTemplate(spec, collectingIo(lines, { [hash]: `${dir}/context.tar.gz` }));
      const at = lines.indexOf("This is a test file.");
      assert.ok(at >= 0, lines.join("\n"));
      assert.deepEqual(
        lines.slice(at, at + 4),
        ["This is a test file.", "12345test.txt", `${dir}/ctx/folder/test.txt`, "640"],
      );
    } finally {
      await executor.close();
      await removeInstanceLeftovers(instanceId);
      await Deno.remove(dir, { recursive: true });
    }
  },
);

dockerTest(
  "DockerExecutor fails a RUN as a user the image lacks naming the user, as E2B does",
  async () => {
    const tag = runTag();
    const instanceId = `u${tag}`;
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
      const error = await executor.buildTemplate(spec, collectingIo([])).catch((e) => e);
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
      await removeInstanceLeftovers(instanceId);
    }
  },
);
