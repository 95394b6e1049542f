/**
 * E2B's default user on Docker template builds: a base image without the user `user` gets it at
 * the base step (busybox and Debian images alike, cached by the base), so a template ending
 * `USER user` builds and its sandboxes run as that user; a base that has it is left as it is.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { DockerExecutor } from "./executor.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import { dockerSuite } from "./_fixtures_test.ts";
import {
  collectingIo,
  execOutput,
  removeInstanceLeftovers,
  runTag,
} from "./_build_fixtures_test.ts";
import type { TemplateBuildSpec } from "../template_build.ts";

const dockerTest = await dockerSuite("build_user_test");

/** Commits `from` after `script` (as root, no network) as a base image labelled `instance`. */
async function baseWithout(
  docker: Docker,
  from: string,
  script: string,
  ref: string,
  instance: string,
): Promise<void> {
  const c = await docker.createContainer({
    Image: from,
    User: "root",
    Entrypoint: ["/bin/sh", "-c"],
    Cmd: [script],
    HostConfig: { NetworkMode: "none" },
  });
  try {
    await c.start();
    const { StatusCode } = await c.wait();
    assert.equal(StatusCode, 0, `preparing ${ref} from ${from}`);
    const [repo, tag] = ref.split(":");
    await c.commit({
      repo,
      tag,
      changes: ["USER root", "WORKDIR /", `LABEL dormice.instance=${instance}`],
    });
  } finally {
    await c.remove({ force: true });
  }
}

dockerTest(
  "DockerExecutor gives a base without E2B's default user that user, once, cached",
  async () => {
    const tag = runTag();
    const instanceId = `w${tag}`;
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    const executor = new DockerExecutor({ nodeId: `builddefuser-${tag}`, instanceId });
    const busybox = `dormice-test-nouser:busybox-${tag}`;
    const debian = `dormice-test-nouser:debian-${tag}`;
    try {
      // dormice-minimal is busybox with neither useradd nor adduser; dormice-base is Debian.
      await baseWithout(
        docker,
        "dormice-minimal:latest",
        "sed -i '/^user:/d' /etc/passwd /etc/group && rm -rf /home/user",
        busybox,
        instanceId,
      );
      await baseWithout(
        docker,
        "dormice-base:latest",
        "userdel -r user 2>/dev/null; rm -rf /home/user; ! id user",
        debian,
        instanceId,
      );
      const build = async (base: string, name: string, check: string) => {
        const lines: string[] = [];
        const spec: TemplateBuildSpec = {
          templateId: `snap-${name.padEnd(14, "x")}${tag}`,
          buildId: crypto.randomUUID(),
          team: "t",
          name,
          fromImage: base,
          steps: [
            { type: "USER", args: ["user"] },
            { type: "WORKDIR", args: ["/home/user"] },
            { type: "RUN", args: [`echo "as $(whoami) $(id -u) in $(pwd)"; touch mine; ${check}`] },
          ],
          force: true,
          memoryMB: 256,
        };
        await executor.buildTemplate(spec, collectingIo(lines));
        return { lines, spec };
      };

      const bb = await build(busybox, "bb", "true");
      assert.ok(bb.lines.includes("as user 1000 in /home/user"), bb.lines.join("\n"));
      assert.ok(bb.lines.some((l) => l.includes("adding the default user 'user'")));
      // The sandboxes of the template run as the user, in its home.
      await executor.create({
        id: "s1",
        name: "s1",
        template: "minimal",
        spec: { memoryMB: 96 },
        env: {},
        snapshot: bb.spec.templateId,
      });
      const out = await execOutput(executor, "s1", [
        "/bin/sh",
        "-c",
        'echo "$(whoami) $(pwd) $(stat -c %U mine)"',
      ]);
      assert.equal(out, "user /home/user user\n");
      await executor.destroy("s1");

      // Debian: useradd, and sudo without a password as E2B's builder sets it up.
      const deb = await build(debian, "deb", "sudo -n true && echo sudo-ok");
      assert.ok(deb.lines.includes("as user 1000 in /home/user"), deb.lines.join("\n"));
      assert.ok(deb.lines.includes("sudo-ok"), deb.lines.join("\n"));

      // Once per base: a rebuild takes the cached base step.
      const again = await build(busybox, "bb2", "true");
      assert.ok(
        again.lines.includes("[base] CACHED adding the default user 'user'"),
        again.lines.join("\n"),
      );

      // A base that has the user is left as it is.
      const has = await build("dormice-minimal:latest", "has", "true");
      assert.ok(has.lines.includes("as user 1000 in /home/user"), has.lines.join("\n"));
      assert.ok(!has.lines.some((l) => l.includes("default user")), has.lines.join("\n"));
    } finally {
      await executor.destroy("s1").catch(() => {});
      await executor.close();
      await removeInstanceLeftovers(instanceId);
    }
  },
);
