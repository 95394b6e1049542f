/**
 * A Docker template build racing the delete of the template it starts from: deleted while the
 * build runs, the build finishes on the base it holds (the files of that template, no other
 * image); deleted before the build holds it, the build fails at its base step naming the
 * template, never with an engine error nor on another image.
 */
import assert from "node:assert/strict";
import { DockerExecutor } from "./executor.ts";
import { dockerSuite } from "./_fixtures_test.ts";
import {
  collectingIo,
  execOutput,
  removeInstanceLeftovers,
  runTag,
} from "./_build_fixtures_test.ts";
import type { TemplateBuildSpec } from "../template_build.ts";
import { TemplateBuildError } from "../template_build.ts";

const dockerTest = await dockerSuite("build_base_race_test");

dockerTest(
  "DockerExecutor: a build whose base template is deleted keeps its base or names it",
  async () => {
    const tag = runTag();
    const instanceId = `r${tag}`;
    const executor = new DockerExecutor({ nodeId: `buildrace-${tag}`, instanceId });
    const id = (c: string) => `snap-${c.repeat(14)}${tag}`;
    const lines: string[] = [];
    const io = (onLine?: (line: string) => void) => collectingIo(lines, {}, onLine);
    const spec = (templateId: string, over: Partial<TemplateBuildSpec>): TemplateBuildSpec => ({
      templateId,
      buildId: crypto.randomUUID(),
      team: "t",
      name: templateId.slice(5, 10) + tag,
      steps: [],
      force: false,
      memoryMB: 256,
      ...over,
    });
    const base = (name: string) =>
      executor.buildTemplate(
        spec(id(name), {
          name: `base-${name}-${tag}`,
          fromTemplate: "minimal",
          steps: [{ type: "RUN", args: [`echo from-${name}-${tag} > /tmp/base`] }],
        }),
        io(),
      );
    try {
      // Deleted while a step of the build runs from it: the build ends on that base.
      await base("x");
      let deleted: Promise<boolean> | undefined;
      const built = await executor.buildTemplate(
        spec(id("y"), {
          fromSnapshot: id("x"),
          fromSnapshotName: `base-x-${tag}`,
          steps: [{
            type: "RUN",
            args: ["echo step-running; sleep 2; cat /tmp/base > /tmp/copied"],
          }],
        }),
        io((line) => {
          // The step's container runs from the base now: the delete only untags it.
          if (line === "step-running" && !deleted) deleted = executor.deleteSnapshot(id("x"));
        }),
      );
      assert.ok(deleted, "the delete ran while the build did");
      assert.equal(await deleted, true, "the base template was deleted");
      assert.equal(built.snapshotId, id("y"));
      assert.ok(!(await executor.listSnapshots("t")).some((s) => s.snapshotId === id("x")));
      await executor.create({
        id: "r1",
        name: "r1",
        template: "minimal",
        spec: { memoryMB: 96 },
        env: {},
        snapshot: id("y"),
      });
      const out = await execOutput(executor, "r1", ["cat", "/tmp/copied"]);
      assert.equal(out, `from-x-${tag}\n`, "built on the deleted template's files");
      await executor.destroy("r1");

      // Deleted before the build holds it: the base step fails naming the template.
      await base("z");
      assert.equal(await executor.deleteSnapshot(id("z")), true);
      const failed = await executor.buildTemplate(
        spec(id("w"), {
          fromSnapshot: id("z"),
          fromSnapshotName: `base-z-${tag}`,
          steps: [{ type: "RUN", args: ["true"] }],
        }),
        io(),
      ).catch((e) => e);
      assert.ok(failed instanceof TemplateBuildError, String(failed));
      assert.equal(failed.step, "base");
      assert.match(failed.message, new RegExp(`base-z-${tag}.*was deleted before this build`));
      assert.ok(!(await executor.listSnapshots("t")).some((s) => s.snapshotId === id("w")));
    } finally {
      await executor.destroy("r1").catch(() => {});
      await executor.close();
      await removeInstanceLeftovers(instanceId);
    }
  },
);
