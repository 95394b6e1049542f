import assert from "node:assert/strict";
import { join } from "node:path";
import { HttpError } from "../../../shared/http_error.ts";
import { readFileStream } from "../../executors/contract.ts";
import { UploadStaging } from "./staging.ts";

function chunks(total: number, size: number): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream({
    pull(c) {
      if (sent >= total) return c.close();
      const n = Math.min(size, total - sent);
      c.enqueue(Uint8Array.from({ length: n }, (_, i) => (sent + i) & 0xff));
      sent += n;
    },
  });
}

async function names(dir: string): Promise<string[]> {
  const out: string[] = [];
  for await (const entry of Deno.readDir(dir)) out.push(entry.name);
  return out.sort();
}

Deno.test("UploadStaging.stage() keeps a small upload in memory and a large one on disk, then removes it", async () => {
  const dir = await Deno.makeTempDir();
  const staging = new UploadStaging({ dir, memoryBytes: 1000 });
  const small = await staging.stage(chunks(1000, 300));
  assert.ok(small.data instanceof Uint8Array);
  assert.equal(small.size, 1000);
  await small.dispose();

  const large = await staging.stage(chunks(10_000, 300));
  assert.equal(large.size, 10_000);
  assert.ok(!(large.data instanceof Uint8Array));
  assert.equal((await names(dir)).length, 1);
  const bytes = await readFileStream(large.data);
  assert.deepEqual(bytes, Uint8Array.from({ length: 10_000 }, (_, i) => i & 0xff));
  await large.dispose();
  assert.deepEqual(await names(dir), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("UploadStaging.stage() passes the body's error on and leaves no file behind", async () => {
  const dir = await Deno.makeTempDir();
  const staging = new UploadStaging({ dir, memoryBytes: 100 });
  let sent = 0;
  const failing = new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent > 1000) return c.error(new HttpError(413, "over the cap"));
      sent += 200;
      c.enqueue(new Uint8Array(200));
    },
  });
  await assert.rejects(
    staging.stage(failing),
    (e: unknown) => e instanceof HttpError && e.status === 413,
  );
  assert.deepEqual(await names(dir), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("UploadStaging sweeps a dead process's staged files at its first use, and nothing else", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(join(dir, "upload-0b1e-42.part"), "left by a crash");
  await Deno.writeTextFile(join(dir, "keep.txt"), "not ours");
  const staging = new UploadStaging({ dir, memoryBytes: 10 });
  const staged = await staging.stage(chunks(100, 50));
  const listed = await names(dir);
  assert.equal(listed.length, 2);
  assert.ok(listed.includes("keep.txt"));
  assert.ok(!listed.includes("upload-0b1e-42.part"));
  await staged.dispose();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("UploadStaging names its directory in a sentence when it cannot write there", async () => {
  const file = await Deno.makeTempFile();
  const staging = new UploadStaging({ dir: join(file, "uploads"), memoryBytes: 10 });
  const error = await staging.stage(chunks(100, 50)).catch((e) => e);
  assert.ok(error instanceof HttpError, String(error));
  assert.equal(error.status, 500);
  assert.match(error.message, /cannot stage the upload in .*uploads/);
  await Deno.remove(file);
});

/** Whether this process may mount a tmpfs (root on Linux); the full-disk test needs one. */
async function canMount(): Promise<boolean> {
  if (Deno.build.os !== "linux" || Deno.uid() !== 0) return false;
  try {
    return (await new Deno.Command("mount", { args: ["--version"], stdout: "null" }).output())
      .success;
  } catch {
    return false;
  }
}

Deno.test({
  name: "UploadStaging answers a full disk with a 507 naming the directory, and cleans up",
  ignore: !await canMount(),
  fn: async () => {
    const mountPoint = await Deno.makeTempDir();
    const mount = await new Deno.Command("mount", {
      args: ["-t", "tmpfs", "-o", "size=64k", "tmpfs", mountPoint],
    }).output();
    assert.ok(mount.success, new TextDecoder().decode(mount.stderr));
    try {
      const dir = join(mountPoint, "uploads");
      const staging = new UploadStaging({ dir, memoryBytes: 10 });
      const error = await staging.stage(chunks(1024 * 1024, 64 * 1024)).catch((e) => e);
      assert.ok(error instanceof HttpError, String(error));
      assert.equal(error.status, 507);
      assert.match(error.message, new RegExp(`no room to stage the upload in ${dir}`));
      assert.deepEqual(await names(dir), []);
    } finally {
      await new Deno.Command("umount", { args: [mountPoint] }).output();
      await Deno.remove(mountPoint, { recursive: true });
    }
  },
});
