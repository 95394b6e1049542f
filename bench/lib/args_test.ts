import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { parseBenchArgs, unknownSections } from "./args.ts";

Deno.test("parseBenchArgs() reads --only, --runs, --out, --quick and --help", () => {
  assert.deepEqual(parseBenchArgs([]), {
    help: false,
    runs: 5,
    only: undefined,
    out: undefined,
    quick: false,
  });
  assert.deepEqual(
    parseBenchArgs(["--only=placement,lookup", "--runs=3", "--out=/tmp/r.md", "--quick"]),
    {
      help: false,
      runs: 3,
      only: ["placement", "lookup"],
      out: "/tmp/r.md",
      quick: true,
    },
  );
  assert.equal((parseBenchArgs(["--help"]) as { help: boolean }).help, true);
  assert.equal((parseBenchArgs(["-h"]) as { help: boolean }).help, true);
  assert.equal((parseBenchArgs(["--quick"]) as { quick: boolean }).quick, true);
});

Deno.test("parseBenchArgs() refuses what it does not know instead of running everything", () => {
  for (
    const bad of ["--onyl=placement", "--help=yes", "placement", "--runs", "--out=", "--quick=1"]
  ) {
    const answer = parseBenchArgs([bad]);
    assert.ok(answer instanceof Error, bad);
    assert.match(answer.message, /Unknown argument .* takes --only=<section>/, bad);
  }
  for (const bad of ["0", "1.5", "x", ""]) {
    const answer = parseBenchArgs([`--runs=${bad}`]);
    assert.ok(answer instanceof Error, bad);
    assert.match(answer.message, /give a positive integer/);
  }
});

Deno.test("unknownSections() names the typo and the sections there are", () => {
  const known = ["placement", "lookup"];
  assert.equal(unknownSections(undefined, known), undefined);
  assert.equal(unknownSections(["lookup"], known), undefined);
  assert.equal(
    unknownSections(["lookup", "placment"], known),
    "--only names no section 'placment': write some of placement, lookup",
  );
  assert.equal(
    unknownSections([], known),
    "--only names no section: write some of placement, lookup",
  );
});

Deno.test("bench/run.ts --help prints the usage and measures nothing", async () => {
  const dir = await Deno.makeTempDir();
  const out = `${dir}/RESULTS.md`;
  const run = (...args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--frozen",
        "--allow-net=127.0.0.1",
        "--allow-read",
        "--allow-write",
        "--allow-run",
        "--allow-env=PATH,CI",
        "--allow-sys=loadavg,osRelease,uid",
        fileURLToPath(new URL("../run.ts", import.meta.url)),
        `--out=${out}`,
        ...args,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
  try {
    const help = await run("--help");
    const text = new TextDecoder().decode(help.stdout);
    assert.equal(help.code, 0, new TextDecoder().decode(help.stderr));
    assert.match(text, /^Usage: deno task bench/);
    assert.match(text, /Sections: placement, lookup, /);
    const typo = await run("--only=placment");
    assert.equal(typo.code, 2);
    assert.match(new TextDecoder().decode(typo.stderr), /no section 'placment': write some of/);
    const stderr = new TextDecoder().decode(help.stderr) + new TextDecoder().decode(typo.stderr);
    assert.doesNotMatch(stderr, /bench: /, "no section started");
    await assert.rejects(Deno.stat(out), Deno.errors.NotFound, "no report was written");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deno task bench: --help and a bad argument answer before bench/setup.sh can install anything", async () => {
  // A stand-in `sh` first on PATH records every script it is asked to run and fails setup.sh
  // instead of running it, so the test never installs anything and never measures.
  const dir = await Deno.makeTempDir();
  const log = `${dir}/sh.log`;
  await Deno.writeTextFile(
    `${dir}/sh`,
    `#!/bin/sh\necho "$@" >> '${log}'\ncase "$1" in *setup.sh) exit 1;; esac\nexec /bin/sh "$@"\n`,
    { mode: 0o755 },
  );
  const task = (...args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args: ["task", "--quiet", "bench", `--out=${dir}/RESULTS.md`, ...args],
      cwd: fileURLToPath(new URL("../..", import.meta.url)),
      env: { PATH: `${dir}:${Deno.env.get("PATH")}`, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
  const setupRuns = () =>
    Deno.readTextFile(log).then((t) => t.match(/setup\.sh/g)?.length ?? 0, () => 0);
  try {
    const help = await task("--help");
    assert.equal(help.code, 0, new TextDecoder().decode(help.stderr));
    assert.match(new TextDecoder().decode(help.stdout), /^Usage: deno task bench/);
    for (const bad of ["--onyl=placement", "--only=placment", "--runs=0"]) {
      const refused = await task(bad);
      assert.equal(refused.code, 2, bad);
    }
    assert.equal(await setupRuns(), 0, "setup.sh ran before the arguments were read");
    // Understood arguments do reach setup.sh, and its failure stops the run before it measures.
    const one = await task("--only=placement", "--runs=1");
    assert.equal(one.code, 1);
    assert.match(new TextDecoder().decode(one.stderr), /bench\/setup\.sh failed .*nothing was/);
    assert.equal(await setupRuns(), 1);
    await assert.rejects(Deno.stat(`${dir}/RESULTS.md`), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
