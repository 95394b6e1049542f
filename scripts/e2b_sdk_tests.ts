/**
 * `deno task sdk-tests <checkout> [test files…]`: runs the e2b JS SDK's own test files against a
 * Dormice fleet on loopback.
 *
 * `<checkout>` is a directory holding a copy of `packages/js-sdk/tests` from github.com/e2b-dev/E2B
 * (the npm package ships no tests, and this repository carries none of them). The task starts
 * `deno task fleet` (a gateway and two nodes, Docker when the engine answers) with its data under
 * `.dormice/sdk-tests/fleet`, points the SDK at it (`E2B_API_URL`, `E2B_SANDBOX_URL`,
 * `E2B_VOLUME_API_URL`, `E2B_API_KEY` from the fleet's banner) and runs the files with vitest from
 * npm, installed with `npm` under `.dormice/sdk-tests/vitest-<version>`. The tests import the SDK's source
 * (`../src`, `../../src/errors`, …); here every such import is the published `e2b@2.51.0`
 * package, the version this repository tests against, so an SDK internal the package does not
 * export reads as `undefined` and that test fails naming it. The tests' template id (an E2B cloud
 * id in `template.ts`) becomes `E2B_TESTS_TEMPLATE` (default `base`). The fleet's nodes run with
 * `DORMICE_EGRESS_E2B_DEFAULT=on`, so the tests run under E2B's defaults: a create that does not
 * say `allowInternetAccess` has egress, as on E2B's cloud.
 *
 * Prints one line per test (`pass`, `fail` with the error's first line, `skip`) and a count, and
 * writes vitest's JSON report to `.dormice/sdk-tests/vitest-<version>/report.json`. Without a checkout, node or
 * npm it says why and exits 0: these tests are the operator's to fetch.
 *
 * As root it first makes a stand-in internet (`_sdk_standin.ts`: `1.1.1.1`, `8.8.8.8` and
 * `connectivitycheck.gstatic.com` in a network namespace, routed there for the run only, with a
 * DNS server the fleet's sandboxes are given) and checks from the host that it answers, so the
 * SDK's network tests never reach a public address; `--no-stand-in` leaves it out, and not root it
 * says why it runs without one.
 *
 * `DORMICE_GATEWAY_PORT` and `DORMICE_FLEET_NODE_PORT` move the fleet's ports as for
 * `deno task fleet`; `E2B_TESTS_TIMEOUT_MS` is vitest's per-test timeout (default 120000);
 * `E2B_TESTS_VITEST` is vitest's version (default 4.1.12; 3.2.4 for files still written for it).
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { join, resolve } from "node:path";
import { fleetEgressCa } from "../examples/_fleet_egress_ca.ts";
import { STAND_IN_DNS, type StandIn, standInReadiness, startStandIn } from "./_sdk_standin.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
/** vitest's version: a file written for an older one (`test(name, fn, options)`) needs 3.2.4. */
const vitestVersion = Deno.env.get("E2B_TESTS_VITEST") || "4.1.12";
const work = join(root, ".dormice", "sdk-tests", `vitest-${vitestVersion}`);
/** npm packages the tests import: vitest (their runner), msw (their mocks), the SDK. */
const npmPackages = [`vitest@${vitestVersion}`, "msw@2", "e2b@2.51.0", "undici@6"];
/** The fleet's data, relative to the repository (its egress CA under `egress-ca/`). */
const fleetDir = ".dormice/sdk-tests/fleet";
/** How long the fleet may take to print its client settings (Docker image checks included). */
const fleetStartMs = 240_000;

function say(line: string): void {
  console.log(line);
}

async function run(cmd: string, args: string[], opts: Deno.CommandOptions = {}): Promise<number> {
  const { code } = await new Deno.Command(cmd, {
    args,
    stdout: "inherit",
    stderr: "inherit",
    ...opts,
  })
    .output();
  return code;
}

async function found(cmd: string): Promise<boolean> {
  try {
    return (await new Deno.Command(cmd, { args: ["--version"], stdout: "null", stderr: "null" })
      .output()).success;
  } catch {
    return false;
  }
}

/** The SDK's source as the tests import it: the npm package, plus `runtime` from `src/utils`. */
const sdkShim =
  `export * from "e2b";\nexport { default } from "e2b";\nexport const runtime = "node";\n`;
/**
 * With `--domain`: every name under the fleet's sandbox domain resolves to loopback in the test
 * workers (node's `dns.lookup` and fetch's dispatcher), where the fleet's gateway serves it: no
 * DNS or /etc/hosts lines for the wildcard names.
 */
const domainPreload = `import dns from "node:dns";
import { Agent, setGlobalDispatcher } from "undici";
const domain = (process.env.E2B_DOMAIN || "").split(":")[0];
if (domain) {
  const original = dns.lookup;
  const lookup = (host, opts, cb) => {
    if (typeof opts === "function") [cb, opts] = [opts, {}];
    if (host !== domain && !host.endsWith("." + domain)) return original(host, opts, cb);
    const o = typeof opts === "number" ? {} : opts || {};
    return o.all
      ? process.nextTick(cb, null, [{ address: "127.0.0.1", family: 4 }])
      : process.nextTick(cb, null, "127.0.0.1", 4);
  };
  dns.lookup = lookup;
  setGlobalDispatcher(new Agent({ connect: { lookup } }));
}
`;

/** The tests' template ids, mapped to a template every fleet node serves. */
const templateShim = `const t = process.env.E2B_TESTS_TEMPLATE || "base";
export const template = t;
export const httpbinTemplate = process.env.E2B_TESTS_HTTPBIN_TEMPLATE || t;
`;

/**
 * vitest's config: resolves the tests' SDK-source imports to the shim above, their `template`
 * module to the template shim, their npm imports (vitest, msw) from our install, and names the
 * newer setup helpers (`hostedTest`, `hostedSandboxTest`, `e2eBuildTemplateTest`: tests that need a
 * real backend) after the plain ones when the checkout's `setup.ts` predates them.
 */
function vitestConfig(checkout: string): string {
  return `import { defineConfig } from "vitest/config";
import { dirname, resolve } from "node:path";
const checkout = ${JSON.stringify(checkout)};
const sdk = resolve(${JSON.stringify(work)}, "sdk_shim.mjs");
const tmpl = resolve(${JSON.stringify(work)}, "template_shim.mjs");
const here = resolve(${JSON.stringify(work)}, "index.mjs");
const inCheckout = (p) => p && p.startsWith(checkout + "/");
export default defineConfig({
  plugins: [{
    name: "e2b-sdk-tests",
    enforce: "pre",
    async resolveId(source, importer) {
      if (!inCheckout(importer)) return null;
      if (/^(\\.\\.\\/)+src(\\/.*)?$/.test(source)) return sdk;
      if (/^\\.\\.?\\//.test(source)) {
        const target = resolve(dirname(importer), source).replace(/\\.(js|ts)$/, "");
        return target === resolve(checkout, "template") ? tmpl : null;
      }
      if (!source.startsWith("/") && !source.startsWith("node:")) {
        return this.resolve(source, here, { skipSelf: true });
      }
      return null;
    },
    transform(code, id) {
      if (id !== resolve(checkout, "setup.ts")) return null;
      let extra = "";
      if (!/export const hostedTest\\b/.test(code)) extra += "\\nexport const hostedTest = base;";
      if (!/export const hostedSandboxTest\\b/.test(code)) {
        extra += "\\nexport const hostedSandboxTest = sandboxTest;";
      }
      if (!/export const e2eBuildTemplateTest\\b/.test(code)) {
        extra += "\\nexport const e2eBuildTemplateTest = buildTemplateTest;";
      }
      return extra ? code + extra + "\\n" : null;
    },
  }],
  test: {
    root: checkout,
    include: ["**/*.test.ts"],
    testTimeout: Number(process.env.E2B_TESTS_TIMEOUT_MS || 120000),
    hookTimeout: Number(process.env.E2B_TESTS_TIMEOUT_MS || 120000),
    fileParallelism: false,
    setupFiles: [resolve(${JSON.stringify(work)}, "domain_preload.mjs")],
  },
});
`;
}

/** Starts `deno task fleet`; resolves with the client settings it prints. */
async function startFleet(
  domain: string | undefined,
  sandboxDns: string | undefined,
): Promise<{ child: Deno.ChildProcess; env: Record<string, string> }> {
  // The SDK's tests assume E2B's defaults: a create that does not say allowInternetAccess has
  // egress (the fleet's own default is none).
  const env: Record<string, string> = {
    DORMICE_FLEET_DIR: fleetDir,
    DORMICE_EGRESS_E2B_DEFAULT: "on",
  };
  if (sandboxDns) env.DORMICE_SANDBOX_DNS = sandboxDns;
  for (const name of ["DORMICE_GATEWAY_PORT", "DORMICE_FLEET_NODE_PORT", "DORMICE_EXECUTOR"]) {
    const value = Deno.env.get(name);
    if (value) env[name] = value;
  }
  const child = new Deno.Command("deno", {
    args: ["task", "fleet", ...(domain ? [`--domain=${domain}`] : [])],
    cwd: root,
    env,
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const settings: Record<string, string> = {};
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const deadline = setTimeout(() => reader.cancel(), fleetStartMs);
  let buffered = "";
  try {
    while (!settings.E2B_API_KEY) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      const lines = buffered.split("\n");
      buffered = lines.pop() ?? "";
      for (const line of lines) {
        const m = line.match(/^\s*export (E2B_[A-Z_]+|NODE_EXTRA_CA_CERTS)=(\S+)\s*$/);
        if (m) settings[m[1]] = m[2];
      }
    }
  } finally {
    clearTimeout(deadline);
  }
  if (!settings.E2B_API_KEY || !(settings.E2B_API_URL || settings.E2B_DOMAIN)) {
    // A fleet that stopped by itself said why on stderr (above); one still running is stopped.
    const exited = await Promise.race([
      child.status.then((status) => status.code),
      new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 100)),
    ]);
    await stopFleet(child);
    throw new Error(
      exited === undefined
        ? `deno task fleet printed no client settings within ${fleetStartMs / 1000} s: ` +
          "run `deno task fleet` alone to see why"
        : `deno task fleet exited with code ${exited} before printing its client settings: ` +
          "its reason is printed above",
    );
  }
  // The banner is read; the rest of the fleet's output is drained so it never blocks.
  (async () => {
    try {
      while (!(await reader.read()).done) { /* drain */ }
    } catch { /* closed */ }
  })();
  return { child, env: settings };
}

async function stopFleet(child: Deno.ChildProcess): Promise<void> {
  try {
    child.kill("SIGTERM");
  } catch { /* already gone */ }
  const timer = setTimeout(() => {
    try {
      child.kill("SIGKILL");
    } catch { /* gone */ }
  }, 60_000);
  await child.status;
  clearTimeout(timer);
}

interface Assertion {
  fullName: string;
  status: string;
  failureMessages?: string[];
}

/** One line per test from vitest's JSON report, and the counts. */
function summarise(reportPath: string, checkout: string): Record<string, number> {
  const report = JSON.parse(Deno.readTextFileSync(reportPath)) as {
    testResults: { name: string; message?: string; assertionResults: Assertion[] }[];
  };
  const counts: Record<string, number> = { pass: 0, fail: 0, skip: 0 };
  for (const file of report.testResults) {
    const rel = file.name.startsWith(checkout) ? file.name.slice(checkout.length + 1) : file.name;
    if (file.assertionResults.length === 0 && file.message) {
      counts.fail++;
      say(`fail  ${rel} (file did not load)\n      ${file.message.split("\n")[0]}`);
    }
    for (const t of file.assertionResults) {
      const status = t.status === "passed" ? "pass" : t.status === "failed" ? "fail" : "skip";
      counts[status]++;
      say(`${status}  ${rel} > ${t.fullName}`);
      if (status === "fail") {
        const first = (t.failureMessages?.[0] ?? "").split("\n").slice(0, 2).join(" | ");
        // The SDK's BuildError keeps the caller's stack without its message line.
        const bare = /^\s*at /.test(first)
          ? "(an error with a stack and no message: the SDK's BuildError; its message is the " +
            "test's [BUILD FAILED] line above) | "
          : "";
        say(`      ${bare}${first.slice(0, 300)}`);
      }
    }
  }
  return counts;
}

/**
 * The stand-in internet (`_sdk_standin.ts`), made unless `--no-stand-in` is given or this host
 * cannot (not root), saying which; checked from the host before any test runs. Its certificate
 * is signed by the fleet egress CA, made here first (`deno task fleet` reuses it).
 */
async function standInFor(optOut: boolean): Promise<StandIn | null> {
  if (optOut) {
    say("Stand-in internet: off (--no-stand-in): tests that reach 1.1.1.1, 8.8.8.8 or a public");
    say("  name go wherever this host routes them.");
    return null;
  }
  const why = await standInReadiness();
  if (why !== null) {
    say(`Stand-in internet: skipped (${why}); tests that reach 1.1.1.1, 8.8.8.8 or a public name`);
    say("  go wherever this host routes them.");
    return null;
  }
  const ca = await fleetEgressCa(join(root, fleetDir));
  if (!("env" in ca)) throw new Error(`No fleet egress CA for the stand-in: ${ca.why}`);
  const caCert = ca.env.DORMICE_EGRESS_CA_CERT;
  const standIn = await startStandIn(caCert, ca.env.DORMICE_EGRESS_CA_KEY, work);
  say("Stand-in internet (removed at exit; --no-stand-in to leave it out):");
  for (const line of standIn.lines) say(`  ${line}`);
  try {
    for (const line of await standIn.verify(Deno.readTextFileSync(caCert))) {
      say(`  checked from this host: ${line}`);
    }
  } catch (error) {
    await standIn.stop();
    throw error;
  }
  return standIn;
}

async function main(args: string[]): Promise<number> {
  const domain = args.find((a) => a.startsWith("--domain="))?.slice("--domain=".length);
  const optOut = args.includes("--no-stand-in");
  const [dir, ...files] = args.filter((a) => !a.startsWith("--domain=") && a !== "--no-stand-in");
  if (!dir) {
    say(
      "No checkout given: deno task sdk-tests <dir with e2b-dev/E2B's packages/js-sdk/tests> " +
        "[test files…]. Nothing to run.",
    );
    return 0;
  }
  const checkout = resolve(dir);
  try {
    Deno.statSync(join(checkout, "setup.ts"));
  } catch {
    say(
      `${checkout} holds no setup.ts: it is not a checkout of packages/js-sdk/tests. Nothing to run.`,
    );
    return 0;
  }
  if (!(await found("node")) || !(await found("npm"))) {
    say("node and npm are needed to run vitest; neither is skipped silently. Nothing to run.");
    return 0;
  }
  Deno.mkdirSync(work, { recursive: true });
  // The shims and the anchor for the tests' npm imports live beside our install.
  Deno.writeTextFileSync(join(work, "sdk_shim.mjs"), sdkShim);
  Deno.writeTextFileSync(join(work, "template_shim.mjs"), templateShim);
  Deno.writeTextFileSync(join(work, "index.mjs"), "");
  Deno.writeTextFileSync(join(work, "domain_preload.mjs"), domainPreload);
  Deno.writeTextFileSync(join(work, "vitest.config.mjs"), vitestConfig(checkout));
  const pkg = join(work, "package.json");
  Deno.writeTextFileSync(pkg, JSON.stringify({ name: "dormice-sdk-tests", private: true }));
  const installed = (spec: string) => {
    try {
      return Deno.statSync(join(work, "node_modules", spec.slice(0, spec.lastIndexOf("@"))))
        .isDirectory;
    } catch {
      return false;
    }
  };
  if (!npmPackages.every(installed)) {
    const code = await run("npm", ["install", "--no-audit", "--no-fund", ...npmPackages], {
      cwd: work,
    });
    if (code !== 0) throw new Error(`npm install ${npmPackages.join(" ")} exited ${code}`);
  }

  const standIn = await standInFor(optOut);
  let fleet: Awaited<ReturnType<typeof startFleet>> | undefined;
  // Ctrl-C or a kill: the host routes and the namespace go, and the fleet stops, before exit.
  const onSignal = async () => {
    if (fleet) await stopFleet(fleet.child);
    await standIn?.stop();
    Deno.exit(130);
  };
  for (const signal of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(signal, onSignal);
  try {
    say("Starting a fleet (deno task fleet)…");
    fleet = await startFleet(domain, standIn ? STAND_IN_DNS : undefined);
    say(
      `Fleet up: ${
        fleet.env.E2B_DOMAIN
          ? `E2B_DOMAIN=${fleet.env.E2B_DOMAIN}`
          : `E2B_API_URL=${fleet.env.E2B_API_URL}`
      }`,
    );
    return await runTests(checkout, files, fleet);
  } finally {
    await standIn?.stop();
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      Deno.removeSignalListener(signal, onSignal);
    }
  }
}

async function runTests(
  checkout: string,
  files: string[],
  fleet: Awaited<ReturnType<typeof startFleet>>,
): Promise<number> {
  const report = join(work, "report.json");
  try {
    Deno.removeSync(report);
  } catch { /* none yet */ }
  try {
    await run(
      "node",
      [
        join(work, "node_modules", "vitest", "vitest.mjs"),
        "run",
        "--config",
        join(work, "vitest.config.mjs"),
        "--reporter=dot",
        "--reporter=json",
        `--outputFile.json=${report}`,
        ...files,
      ],
      {
        cwd: checkout,
        env: { ...fleet.env, E2B_TESTS_TEMPLATE: Deno.env.get("E2B_TESTS_TEMPLATE") ?? "base" },
      },
    );
  } finally {
    await stopFleet(fleet.child);
  }
  try {
    Deno.statSync(report);
  } catch {
    say(`vitest wrote no report (${report}): it was stopped or could not start; see above.`);
    return 1;
  }
  const counts = summarise(report, checkout);
  say(`\n${counts.pass} passed, ${counts.fail} failed, ${counts.skip} skipped (report: ${report})`);
  return counts.fail === 0 ? 0 : 1;
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (error) {
    // A run that could not start says why in one line, not as a stack.
    console.error(`sdk-tests: ${error instanceof Error ? error.message : String(error)}`);
    Deno.exit(1);
  }
}
