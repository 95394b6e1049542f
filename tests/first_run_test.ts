/**
 * What a fresh checkout prints before any of its code runs: Deno sets up `node_modules` at the
 * first `deno run` (deno.json's `"nodeModulesDir": "auto"`), one `Initialize` line per package
 * (about 150), and used to add a boxed warning about the build scripts it skipped (protobufjs,
 * ssh2, cpu-features). deno.json denies those three (none is needed: protobufjs' only checks
 * version schemes, ssh2's builds an optional binding for ssh:// engines the executor never
 * uses, cpu-features is that binding's optional helper), and `deno task fleet` runs quietly.
 *
 * Each case copies deno.json and deno.lock into a fresh directory, so node_modules is made anew
 * from Deno's cache, and runs a script that imports one npm package.
 */
import assert from "node:assert/strict";
import { repoRoot } from "./_processes.ts";

/** A fresh directory holding the project's deno.json, deno.lock and a one-import script. */
async function freshCheckout(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-first-run-" });
  await Deno.copyFile(`${repoRoot}deno.json`, `${dir}/deno.json`);
  await Deno.copyFile(`${repoRoot}deno.lock`, `${dir}/deno.lock`);
  await Deno.writeTextFile(`${dir}/probe.ts`, 'import "zod";\nconsole.log("ran");\n');
  return dir;
}

async function run(dir: string, flags: string[]): Promise<{ stdout: string; stderr: string }> {
  const env: Record<string, string> = { NO_COLOR: "1" };
  for (const name of ["HOME", "PATH", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...flags, "probe.ts"],
    cwd: dir,
    env,
    clearEnv: true,
    stdin: "null",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  assert.ok(out.success, text(out.stderr));
  return { stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** The flags of one of deno.json's tasks, between `deno run` and the script. */
function taskFlags(name: string): string[] {
  const words: string[] = JSON.parse(Deno.readTextFileSync(`${repoRoot}deno.json`)).tasks[name]
    .split(/\s+/);
  return words.slice(words.indexOf("run") + 1, -1);
}

Deno.test("a first deno run of a fresh checkout shows no box of ignored build scripts", async () => {
  const dir = await freshCheckout();
  try {
    const { stdout, stderr } = await run(dir, ["--frozen"]);
    assert.equal(stdout, "ran\n");
    assert.match(stderr, /Initialize zod@/, "the precondition: node_modules was made just now");
    assert.doesNotMatch(stderr, /Ignored build scripts|approve-scripts/, stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deno task fleet's first run prints nothing of Deno's own", async () => {
  const dir = await freshCheckout();
  try {
    const { stdout, stderr } = await run(dir, taskFlags("fleet"));
    assert.equal(stdout, "ran\n");
    assert.ok((await Deno.stat(`${dir}/node_modules/.deno`)).isDirectory, "made just now");
    assert.equal(stderr, "");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
