/**
 * The executor contract for the file verbs (write, read, stat, list, makeDir, move, remove, the
 * run-as user, metadata) and directory watches, run against both executors by
 * `_contract_fixtures_test.ts`.
 */
import assert from "node:assert/strict";
import type { FsChange } from "./contract.ts";
import { type Case, contractSuite, encoder, rejectsWith, run } from "./_contract_fixtures_test.ts";
import { chunked } from "../../shared/_stream_fixtures_test.ts";

/** Waits until `check()` holds, up to `ms` (a watch sees a command's change within an interval). */
async function until(what: string, check: () => boolean, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`Gave up waiting ${ms} ms for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const cases: Record<string, Case> = {
  "writeFile() and readFile() keep every byte and create parents": async (ex, id) => {
    const data = new Uint8Array(70_000);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 8)) & 0xff;
    const entry = await ex.writeFile(id, "/tmp/deep/er/blob.bin", data);
    assert.equal(entry.name, "blob.bin");
    assert.equal(entry.path, "/tmp/deep/er/blob.bin");
    assert.equal(entry.type, "file");
    assert.equal(entry.size, data.length);
    assert.deepEqual(await ex.readFile(id, "/tmp/deep/er/blob.bin"), data);
    await ex.writeFile(id, "/tmp/deep/er/blob.bin", new Uint8Array([0, 255, 10]));
    assert.deepEqual(await ex.readFile(id, "/tmp/deep/er/blob.bin"), new Uint8Array([0, 255, 10]));
    await ex.writeFile(id, "/tmp/empty", new Uint8Array());
    assert.deepEqual(await ex.readFile(id, "/tmp/empty"), new Uint8Array());
  },
  "writeFile() takes a FileStream: every byte, parents created, a wrong length refused": async (
    ex,
    id,
  ) => {
    const size = 3 * 1024 * 1024 + 5;
    const data = new Uint8Array(size);
    for (let i = 0; i < size; i++) data[i] = (i * 13 + (i >> 10)) & 0xff;
    const entry = await ex.writeFile(id, "/tmp/streamed/deep/big.bin", {
      size,
      stream: chunked(data, 64 * 1024),
    });
    assert.equal(entry.size, size);
    assert.equal(entry.path, "/tmp/streamed/deep/big.bin");
    assert.deepEqual(await ex.readFile(id, "/tmp/streamed/deep/big.bin"), data);
    await rejectsWith(
      ex.writeFile(id, "/tmp/short.bin", { size: 10, stream: chunked(data.subarray(0, 5), 5) }),
      "invalid",
    );
    await rejectsWith(
      ex.writeFile(id, "/tmp/long.bin", { size: 5, stream: chunked(data.subarray(0, 10), 5) }),
      "invalid",
    );
    // A stream that fails is that failure, not an engine error.
    const failing = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new Uint8Array(100));
        c.error(new RangeError("the upload was cut"));
      },
    });
    await assert.rejects(
      ex.writeFile(id, "/tmp/failed.bin", { size: 1000, stream: failing }),
      RangeError,
    );
  },
  "a relative path is relative to the home": async (ex, id) => {
    const entry = await ex.writeFile(id, "notes.txt", encoder.encode("hi"));
    assert.equal(entry.path, "/home/user/notes.txt");
    assert.equal((await run(ex, id, "cat /home/user/notes.txt")).stdout, "hi");
  },
  "files written are seen by commands and the reverse": async (ex, id) => {
    await ex.writeFile(id, "/tmp/in.txt", encoder.encode("from the api\n"));
    const r = await run(ex, id, "cat /tmp/in.txt; echo from a command > /tmp/out.txt");
    assert.equal(r.stdout, "from the api\n");
    assert.equal(
      new TextDecoder().decode(await ex.readFile(id, "/tmp/out.txt")),
      "from a command\n",
    );
  },
  "file calls honour the run-as user: root's files are root's, the user's the user's": async (
    ex,
    id,
  ) => {
    const asRoot = { user: "root" };
    assert.equal(await ex.makeDir(id, "/opt/x", asRoot), true);
    assert.equal((await ex.stat(id, "/opt/x")).owner, "root");
    const file = await ex.writeFile(id, "/root/r.txt", encoder.encode("r"), asRoot);
    assert.equal(file.owner, "root");
    assert.equal((await ex.stat(id, "/root/r.txt", asRoot)).owner, "root");
    const listed = await ex.listDir(id, "/root", 1, asRoot);
    assert.deepEqual(listed.filter((e) => e.name === "r.txt").map((e) => e.owner), ["root"]);
    // Relative paths start at the run-as user's home.
    assert.equal(
      (await ex.writeFile(id, "rel.txt", encoder.encode("r"), asRoot)).path,
      "/root/rel.txt",
    );
    assert.deepEqual(await ex.readFile(id, "rel.txt", asRoot), encoder.encode("r"));
    // The sandbox's own user owns what it creates, parents included, even where only root may
    // write: envd creates as root and hands the result over.
    assert.equal((await ex.writeFile(id, "/tmp/u/v/w.txt", encoder.encode("w"))).owner, "user");
    assert.equal((await ex.stat(id, "/tmp/u/v")).owner, "user");
    assert.equal(await ex.makeDir(id, "/opt/mine"), true);
    assert.equal((await ex.stat(id, "/opt/mine")).owner, "user");
    assert.equal((await ex.stat(id, "/opt")).owner, "root");
  },
  "readFile() reads a virtual file to its end though its stat says size 0": async (ex, id) => {
    const version = new TextDecoder().decode(await ex.readFile(id, "/proc/version"));
    assert.match(version, /^Linux version /);
    assert.equal((await ex.stat(id, "/proc/version")).size, 0);
    assert.equal((await run(ex, id, "cat /proc/version")).stdout, version);
    await rejectsWith(ex.readFile(id, "/proc/no-such-file"), "not_found");
    await rejectsWith(ex.readFile(id, "/proc"), "is_dir");
  },
  "stat() describes files and directories": async (ex, id) => {
    await ex.writeFile(id, "/tmp/s/f.txt", encoder.encode("12345"));
    const file = await ex.stat(id, "/tmp/s/f.txt");
    assert.equal(file.type, "file");
    assert.equal(file.size, 5);
    assert.equal(file.name, "f.txt");
    assert.equal(file.mode, 0o644);
    assert.equal(file.owner, "user");
    assert.ok(file.modifiedAt > 1_600_000_000_000, `modifiedAt ${file.modifiedAt} is ms`);
    const dir = await ex.stat(id, "/tmp/s");
    assert.equal(dir.type, "dir");
    assert.equal(dir.path, "/tmp/s");
  },
  "stat() and listDir() describe entries as lstat does, symlinks with their target": async (
    ex,
    id,
  ) => {
    await ex.writeFile(id, "/tmp/meta/f.txt", encoder.encode("hello"));
    await ex.makeDir(id, "/tmp/meta/d");
    const made = await run(
      ex,
      id,
      "cd /tmp/meta && ln -s f.txt lf && ln -s lf lf2 && ln -s ../meta/d ld && ln -s /tmp/no/x broken",
    );
    assert.equal(made.exit.exitCode, 0, made.stderr);
    const dir = await ex.stat(id, "/tmp/meta/d");
    assert.ok(dir.size > 0, `a directory's size is its own, not 0: ${dir.size}`);
    assert.equal(dir.mode, 0o755);
    assert.equal(dir.targetType, undefined);
    const file = await ex.stat(id, "/tmp/meta/f.txt");
    assert.deepEqual([file.size, file.mode, file.owner, file.group], [5, 0o644, "user", "user"]);
    const link = await ex.stat(id, "/tmp/meta/lf2");
    assert.deepEqual(
      [link.type, link.symlinkTarget, link.targetType, link.targetMode],
      ["symlink", "/tmp/meta/f.txt", "file", 0o644],
    );
    const listed = await ex.listDir(id, "/tmp/meta");
    assert.deepEqual(
      listed.map((e) => [e.name, e.type, e.symlinkTarget, e.targetType]),
      [
        ["broken", "symlink", "/tmp/no/x", undefined],
        ["d", "dir", undefined, undefined],
        ["f.txt", "file", undefined, undefined],
        ["ld", "symlink", "/tmp/meta/d", "dir"],
        ["lf", "symlink", "/tmp/meta/f.txt", "file"],
        ["lf2", "symlink", "/tmp/meta/f.txt", "file"],
      ],
    );
    // The sandbox reads through a link.
    assert.deepEqual(await ex.readFile(id, "/tmp/meta/lf2"), encoder.encode("hello"));
  },
  "listDir() lists children sorted by path, deeper with depth": async (ex, id) => {
    await ex.writeFile(id, "/tmp/l/b.txt", encoder.encode("b"));
    await ex.writeFile(id, "/tmp/l/a/inner.txt", encoder.encode("i"));
    const one = await ex.listDir(id, "/tmp/l");
    assert.deepEqual(one.map((e) => [e.path, e.type]), [["/tmp/l/a", "dir"], [
      "/tmp/l/b.txt",
      "file",
    ]]);
    const two = await ex.listDir(id, "/tmp/l", 2);
    assert.deepEqual(two.map((e) => e.path), ["/tmp/l/a", "/tmp/l/a/inner.txt", "/tmp/l/b.txt"]);
    assert.equal(two[1].size, 1);
  },
  "makeDir() creates parents and says whether it existed": async (ex, id) => {
    assert.equal(await ex.makeDir(id, "/tmp/m/n/o"), true);
    assert.equal(await ex.makeDir(id, "/tmp/m/n/o"), false);
    assert.equal((await ex.stat(id, "/tmp/m/n")).type, "dir");
    await ex.writeFile(id, "/tmp/m/file", encoder.encode("x"));
    await rejectsWith(ex.makeDir(id, "/tmp/m/file"), "exists");
    await rejectsWith(ex.makeDir(id, "/tmp/m/file/below"), "not_dir");
  },
  "move() renames files and trees": async (ex, id) => {
    await ex.writeFile(id, "/tmp/mv/a.txt", encoder.encode("a"));
    const moved = await ex.move(id, "/tmp/mv/a.txt", "/tmp/mv/b.txt");
    assert.equal(moved.path, "/tmp/mv/b.txt");
    assert.equal(moved.size, 1);
    await rejectsWith(ex.stat(id, "/tmp/mv/a.txt"), "not_found");
    await ex.writeFile(id, "/tmp/mv/tree/leaf", encoder.encode("leaf"));
    assert.equal((await ex.move(id, "/tmp/mv/tree", "/tmp/mv/tree2")).type, "dir");
    assert.deepEqual(await ex.readFile(id, "/tmp/mv/tree2/leaf"), encoder.encode("leaf"));
    await ex.writeFile(id, "/tmp/mv/c.txt", encoder.encode("c"));
    await ex.move(id, "/tmp/mv/c.txt", "/tmp/mv/b.txt"); // an existing file is replaced
    assert.deepEqual(await ex.readFile(id, "/tmp/mv/b.txt"), encoder.encode("c"));
    await rejectsWith(ex.move(id, "/tmp/mv/b.txt", "/tmp/mv/tree2"), "exists");
    await rejectsWith(ex.move(id, "/tmp/mv/missing", "/tmp/mv/x"), "not_found");
    await rejectsWith(ex.move(id, "/tmp/mv/b.txt", "/tmp/nowhere/x"), "not_found");
    await rejectsWith(ex.move(id, "/tmp/mv/tree2", "/tmp/mv/tree2/in"), "invalid");
  },
  "remove() removes files and trees": async (ex, id) => {
    await ex.writeFile(id, "/tmp/rm/a/b/c.txt", encoder.encode("c"));
    await ex.writeFile(id, "/tmp/rm/f.txt", encoder.encode("f"));
    await ex.remove(id, "/tmp/rm/f.txt");
    await ex.remove(id, "/tmp/rm/a");
    assert.deepEqual(await ex.listDir(id, "/tmp/rm"), []);
  },
  "remove() of a missing path is a no-op, unless its parent is a file": async (ex, id) => {
    await ex.remove(id, "/tmp/rm-none");
    await ex.remove(id, "/tmp/rm-none/deeper/still");
    await ex.writeFile(id, "/tmp/rm-file", encoder.encode("f"));
    await rejectsWith(ex.remove(id, "/tmp/rm-file/below"), "not_dir");
    assert.deepEqual(await ex.readFile(id, "/tmp/rm-file"), encoder.encode("f"));
  },
  "file calls name what is wrong with a path": async (ex, id) => {
    await ex.writeFile(id, "/tmp/e/file", encoder.encode("x"));
    await rejectsWith(ex.readFile(id, "/tmp/e/missing"), "not_found");
    // The sentence names the missing path, not the sandbox, which is still there.
    await assert.rejects(ex.readFile(id, "/tmp/e/missing"), /\/tmp\/e\/missing/);
    await rejectsWith(ex.stat(id, "/tmp/e/missing"), "not_found");
    await rejectsWith(ex.listDir(id, "/tmp/e/missing"), "not_found");
    await rejectsWith(ex.readFile(id, "/tmp/e"), "is_dir");
    await rejectsWith(ex.writeFile(id, "/tmp/e", encoder.encode("x")), "is_dir");
    await rejectsWith(ex.listDir(id, "/tmp/e/file"), "not_dir");
    await rejectsWith(ex.writeFile(id, "/tmp/e/file/below", encoder.encode("x")), "not_dir");
    await rejectsWith(ex.readFile(id, ""), "invalid");
    await rejectsWith(ex.readFile(id, "/tmp/e/nul\0byte"), "invalid");
  },
  "writeFile() keeps metadata that stat and listDir show, on base; minimal refuses it": async (
    ex,
    id,
  ) => {
    // The suite's sandbox is minimal (busybox, no setfattr): metadata is refused, not dropped.
    const refused = ex.writeFile(id, "/tmp/m.txt", encoder.encode("x"), {
      metadata: { owner: "ana" },
    });
    await rejectsWith(refused, "invalid");
    await refused.catch((e) => assert.match(e.message, /no setfattr.*use the base template/));
    await rejectsWith(ex.stat(id, "/tmp/m.txt"), "not_found");
    const base = `${id}-base`;
    await ex.create({ id: base, name: base, template: "base", spec: {}, env: {} });
    try {
      const meta = { owner: "ana", "note.v2": "a b=c" };
      const written = await ex.writeFile(base, "/tmp/d/m.txt", encoder.encode("x"), {
        metadata: meta,
      });
      assert.deepEqual(written.metadata, meta);
      assert.deepEqual((await ex.stat(base, "/tmp/d/m.txt")).metadata, meta);
      await ex.writeFile(base, "/tmp/d/plain.txt", encoder.encode("y"));
      const listed = await ex.listDir(base, "/tmp/d");
      assert.deepEqual(listed.map((e) => [e.name, e.metadata]), [
        ["m.txt", meta],
        ["plain.txt", undefined],
      ]);
      // It follows the file through a rename; a write replacing the file replaces it.
      assert.deepEqual((await ex.move(base, "/tmp/d/m.txt", "/tmp/d/n.txt")).metadata, meta);
      await ex.writeFile(base, "/tmp/d/n.txt", encoder.encode("z"));
      assert.equal((await ex.stat(base, "/tmp/d/n.txt")).metadata, undefined);
    } finally {
      await ex.destroy(base);
    }
  },
  "watch() reports a file verb's change before the verb resolves, as envd's inotify": async (
    ex,
    id,
  ) => {
    await ex.makeDir(id, "/tmp/w");
    const changes: FsChange[] = [];
    const watch = await ex.watch(id, { path: "/tmp/w" }, (c) => changes.push(c));
    const seen = () => changes.splice(0).map((c) => `${c.type} ${c.path}`);
    try {
      await ex.writeFile(id, "/tmp/w/a.txt", encoder.encode("a"));
      // Created, handed to the user (envd's chown), written.
      assert.deepEqual(seen(), ["create /tmp/w/a.txt", "chmod /tmp/w/a.txt", "write /tmp/w/a.txt"]);
      await ex.writeFile(id, "/tmp/w/a.txt", encoder.encode("again"));
      assert.deepEqual(seen(), ["chmod /tmp/w/a.txt", "write /tmp/w/a.txt"]);
      await ex.move(id, "/tmp/w/a.txt", "/tmp/w/b.txt");
      assert.deepEqual(seen(), ["rename /tmp/w/a.txt", "create /tmp/w/b.txt"]);
      await ex.makeDir(id, "/tmp/w/sub/deeper");
      // Not recursive: the new directory, not what is below it.
      assert.deepEqual(seen(), ["create /tmp/w/sub", "chmod /tmp/w/sub"]);
      await ex.remove(id, "/tmp/w/b.txt");
      assert.deepEqual(seen(), ["remove /tmp/w/b.txt"]);
    } finally {
      await watch.stop();
    }
    await ex.writeFile(id, "/tmp/w/after.txt", encoder.encode("x"));
    assert.deepEqual(seen(), [], "a stopped watch reports nothing");
  },
  "watch() sees what commands change, below the directory only when recursive": async (
    ex,
    id,
  ) => {
    await ex.makeDir(id, "/tmp/c/deep");
    const flat: FsChange[] = [];
    const deep: FsChange[] = [];
    const w1 = await ex.watch(id, { path: "/tmp/c" }, (c) => flat.push(c));
    const w2 = await ex.watch(id, { path: "/tmp/c", recursive: true }, (c) => deep.push(c));
    const has = (list: FsChange[], type: string, path: string) =>
      list.some((c) => c.type === type && c.path === path);
    try {
      const r = await run(ex, id, "echo x > /tmp/c/top.txt && echo y > /tmp/c/deep/in.txt");
      assert.equal(r.exit.exitCode, 0, r.stderr);
      await until(
        "the recursive watch to see the deep write",
        () => has(deep, "create", "/tmp/c/deep/in.txt") && has(deep, "write", "/tmp/c/deep/in.txt"),
      );
      await until("the flat watch to see the write", () => has(flat, "write", "/tmp/c/top.txt"));
      assert.ok(has(flat, "create", "/tmp/c/top.txt"), JSON.stringify(flat));
      assert.ok(!flat.some((c) => c.path.startsWith("/tmp/c/deep/")), JSON.stringify(flat));
      // One change at a time: a watch that polls sees a create and a chmod in one look as one.
      await run(ex, id, "chmod 600 /tmp/c/top.txt");
      await until("the chmod", () => has(flat, "chmod", "/tmp/c/top.txt"));
      await run(ex, id, "mv /tmp/c/top.txt /tmp/c/moved.txt");
      await until(
        "the rename",
        () => has(flat, "rename", "/tmp/c/top.txt") && has(flat, "create", "/tmp/c/moved.txt"),
      );
      await run(ex, id, "rm /tmp/c/moved.txt");
      await until("the removal", () => has(flat, "remove", "/tmp/c/moved.txt"));
    } finally {
      await Promise.all([w1.stop(), w2.stop()]);
    }
  },
  "watch() refuses a missing path and a file, and ends when the sandbox goes": async (
    ex,
    id,
  ) => {
    await rejectsWith(ex.watch(id, { path: "/tmp/no-such-dir" }, () => {}), "not_found");
    await ex.writeFile(id, "/tmp/plain", encoder.encode("x"));
    await rejectsWith(ex.watch(id, { path: "/tmp/plain" }, () => {}), "not_dir");
    const watch = await ex.watch(id, { path: "/tmp" }, () => {});
    await ex.destroy(id);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const ended = await Promise.race([
      watch.ended.then(() => true),
      new Promise<false>((resolve) => timer = setTimeout(resolve, 10_000, false)),
    ]).finally(() => clearTimeout(timer));
    assert.ok(ended, "the watch ended with its sandbox");
  },
};

await contractSuite(cases);
