/**
 * A node whose data disk fills up: a real `node/main.ts` process with DORMICE_DATA_DIR on a
 * 2 MiB tmpfs, filled to the last byte by the test. Mounting needs root; off CI a non-root run
 * skips with the reason, with `CI=true` (which runs as root) it must run.
 */
import assert from "node:assert/strict";
import { freePort, nodeMain, nodePermissions, spawnDeno, startNode } from "./_processes.ts";

const isRoot = Deno.uid() === 0;
const onCi = Deno.env.get("CI") === "true";
if (!isRoot && !onCi) {
  console.log("disk-full suite skipped: mounting a tmpfs needs root (run the tests as root)");
}

async function run(cmd: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
}

/** Writes zeros into `path` until the file system refuses; returns the bytes written. */
function fill(path: string): number {
  const file = Deno.openSync(path, { write: true, create: true, append: true });
  let written = 0;
  try {
    // Big chunks first, then smaller ones: tmpfs hands out whole pages, so the last page
    // partly used is filled by the small writes.
    for (const size of [64 * 1024, 4096, 512, 1]) {
      const chunk = new Uint8Array(size);
      try {
        for (;;) written += file.writeSync(chunk);
      } catch (error) {
        if (!/No space left|os error 28/.test(String(error))) throw error;
      }
    }
  } finally {
    file.close();
  }
  return written;
}

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

async function call(
  url: string,
  path: string,
  body: unknown,
  headers: Record<string, string>,
): Promise<Answer> {
  const res = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (text === "") return { status: res.status, body: {} };
  try {
    return { status: res.status, body: JSON.parse(text) };
  } catch {
    throw new Error(`POST ${path} answered ${res.status} with a non-JSON body: ${text}`);
  }
}

Deno.test({
  name:
    "node on a full data disk: commands and reads work, destroy frees, writes are 507, boot refuses",
  ignore: !isRoot && !onCi,
  async fn() {
    if (!isRoot) throw new Error("CI=true, so the disk-full suite must run, but it is not root");
    const dataDir = await Deno.makeTempDir({ prefix: "dormice-full-" });
    await run("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dataDir);
    const filler = `${dataDir}/filler`;
    let node: Awaited<ReturnType<typeof startNode>> | undefined;
    try {
      node = await startNode({ dataDir });
      const { url, token } = node;
      const native = (verb: string, body: unknown) =>
        call(url, `/${verb}`, body, { authorization: `Bearer ${token}` });
      const e2b = (path: string, body: unknown) =>
        call(url, `/e2b/api${path}`, body, { "x-api-key": token });

      for (const name of ["keep", "gone-1", "gone-2"]) {
        assert.equal((await native("acquireSandbox", { name })).status, 200);
      }
      assert.equal(
        (await native("writeFile", { name: "keep", path: "/tmp/a", content: "hello" })).status,
        200,
      );
      // autoResume, so envd traffic tries to wake it (without it a paused E2B sandbox refuses
      // envd traffic before any write is tried).
      const paused = await e2b("/sandboxes", {
        templateID: "base",
        metadata: { name: "napper" },
        autoPause: true,
        autoResume: { enabled: true },
      });
      assert.equal(paused.status, 201, JSON.stringify(paused.body));
      const napper = paused.body.sandboxID as string;
      const access = paused.body.envdAccessToken as string;
      assert.equal((await e2b(`/sandboxes/${napper}/pause`, {})).status, 204);
      const before = (await native("listSandboxes", {})).body.sandboxes as {
        name: string;
        lastActiveAt: string;
      }[];

      assert.ok(fill(filler) > 0);

      // Commands and reads need no ledger write, so they work, and the idle clock moves.
      await new Promise((resolve) => setTimeout(resolve, 20));
      const exec = await native("execCommand", { name: "keep", command: "echo still here" });
      assert.equal(exec.status, 200, JSON.stringify(exec.body));
      assert.equal(exec.body.stdout, "still here\n");
      const read = await native("readFile", { name: "keep", path: "/tmp/a" });
      assert.equal(read.status, 200, JSON.stringify(read.body));
      assert.equal(atob(read.body.contentBase64 as string), "hello");
      const after = (await native("listSandboxes", {})).body.sandboxes as typeof before;
      const clock = (list: typeof before) => list.find((s) => s.name === "keep")!.lastActiveAt;
      assert.ok(clock(after) > clock(before), `${clock(after)} after ${clock(before)}`);

      // A write that needs room is a 507 naming the data dir, in each face's dialect.
      const create = await native("acquireSandbox", { name: "newcomer" });
      assert.equal(create.status, 507, JSON.stringify(create.body));
      assert.deepEqual(Object.keys(create.body), ["message"]);
      assert.match(
        create.body.message as string,
        new RegExp(`data disk is full: DORMICE_DATA_DIR \\(${dataDir}\\).*sandbox 'newcomer'`),
      );
      const e2bCreate = await e2b("/sandboxes", { templateID: "base" });
      assert.equal(e2bCreate.status, 507);
      assert.equal(e2bCreate.body.code, 507);
      assert.match(e2bCreate.body.message as string, /DORMICE_DATA_DIR/);
      // Waking a paused sandbox writes its state: refused, and it stays paused.
      const stat = await call(url, "/e2b/envd/filesystem.Filesystem/Stat", { path: "/" }, {
        "e2b-sandbox-id": napper,
        "x-access-token": access,
      });
      assert.equal(stat.status, 429, JSON.stringify(stat.body)); // Connect's resource_exhausted
      assert.equal(stat.body.code, "resource_exhausted");
      assert.match(stat.body.message as string, /DORMICE_DATA_DIR/);
      const napperRow = await native("lookupSandbox", { id: napper });
      assert.equal((napperRow.body.sandbox as { state: string }).state, "frozen");

      // Destroy is what frees space: it works on the full disk, paused or not.
      for (const name of ["gone-1", "gone-2", "napper"]) {
        const destroyed = await native("destroySandbox", { name });
        assert.equal(destroyed.status, 200, `${name}: ${JSON.stringify(destroyed.body)}`);
        assert.equal(destroyed.body.destroyed, true);
      }
      const left = (await native("listSandboxes", {})).body.sandboxes as { name: string }[];
      assert.deepEqual(left.map((s) => s.name), ["keep"]);
      // The room the reserve gave back is kept for destroys.
      assert.equal((await native("acquireSandbox", { name: "newcomer" })).status, 507);
      assert.match(node.process.stderr(), /gave up its reserve to record a destroy/);

      assert.equal((await node.stop()).code, 0);
      fill(filler);

      // Boot on the full disk: a clean refusal naming the variable, not an uncaught error.
      const refused = spawnDeno(nodeMain, {
        env: {
          DORMICE_API_TOKEN: token,
          DORMICE_PORT: String(freePort()),
          DORMICE_DATA_DIR: dataDir,
          DORMICE_EXECUTOR: "fake",
        },
        permissions: nodePermissions(dataDir),
      });
      const status = await Promise.race([
        refused.exited,
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error("the node did not exit on a full disk")), 20_000)
        ),
      ]).finally(() => refused.stop(100));
      assert.notEqual(status.code, 0);
      assert.match(
        refused.stderr(),
        new RegExp(`Cannot start: the disk of DORMICE_DATA_DIR \\(${dataDir}\\) is full`),
      );
      assert.doesNotMatch(refused.stderr(), /Uncaught|error: /);

      // With room again the node boots with its row, and takes new sandboxes once more.
      await Deno.remove(filler);
      node = await startNode({ dataDir, token });
      const again = (await call(node.url, "/listSandboxes", {}, {
        authorization: `Bearer ${token}`,
      })).body.sandboxes as { name: string }[];
      assert.deepEqual(again.map((s) => s.name), ["keep"]);
      const late = await call(node.url, "/acquireSandbox", { name: "newcomer" }, {
        authorization: `Bearer ${token}`,
      });
      assert.equal(late.status, 200, JSON.stringify(late.body));
    } finally {
      await node?.stop();
      await run("umount", "-l", dataDir).catch((error) => console.error(error));
      await Deno.remove(dataDir, { recursive: true }).catch(() => {});
    }
  },
});
