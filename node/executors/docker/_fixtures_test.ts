/**
 * One answer, for every docker suite, to "can the Docker half run here?": an engine must answer
 * and the base and minimal template images must exist. An engine lacking some gets them built once, each by its
 * own script (`deploy/images/build-minimal.sh`: seconds; `deploy/images/build-base.sh`: about
 * 50 s on a fresh machine, debootstrap from Debian's mirror; no registry), so a contributor with
 * Docker exercises Docker instead of failing or silently skipping.
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { buildCommandOf, DockerExecutor, parseTemplates } from "./mod.ts";

/** Whether the Docker half can run, and why not. */
export type DockerReadiness = { ready: true } | { ready: false; why: string };

/** A template whose image the engine lacks, as `DockerExecutor.connect()` warned of it. */
export interface MissingImage {
  template: string;
  image: string;
  /** The executor's sentence. */
  message: string;
}

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

/**
 * The images every docker suite needs. The code interpreter's (minutes of apt-get) is its own
 * suite's to ask for (tests/docker_code_interpreter_test.ts), so that it never holds up the others.
 */
const SUITE_TEMPLATES = parseTemplates(
  "base=dormice-base:latest,minimal=dormice-minimal:latest",
) as Map<
  string,
  string
>;

/** The engine's answer: down (why), or the template images it lacks. */
async function probeEngine(): Promise<{ down: string } | { missing: MissingImage[] }> {
  const missing: MissingImage[] = [];
  try {
    const executor = await DockerExecutor.connect({
      nodeId: "readiness-probe",
      templates: SUITE_TEMPLATES,
      callTimeoutMs: 3_000,
      // connect() warns, rather than refuses, for a template image that is not built.
      log: (level, message, fields) =>
        level === "warn" && missing.push({
          template: String(fields?.template ?? ""),
          image: String(fields?.image ?? ""),
          message,
        }),
    });
    await executor.close();
    return { missing };
  } catch (error) {
    return { down: error instanceof Error ? error.message : String(error) };
  }
}

/** What {@linkcode decideReadiness} needs: a look at the engine, and a way to build images. */
export interface ReadinessSteps {
  /** The engine's answer: down (why), or the template images it lacks. */
  probe(): Promise<{ down: string } | { missing: MissingImage[] }>;
  /** Runs one build command (script, image); the last lines it printed when it failed. */
  build(
    command: [script: string, image: string],
  ): Promise<{ ok: true } | { ok: false; said: string }>;
}

async function runBuild(
  [script, image]: [string, string],
): Promise<{ ok: true } | { ok: false; said: string }> {
  const built = await new Deno.Command("bash", {
    args: [repoRoot + script, image],
    stdout: "piped",
    stderr: "piped",
  })
    .output()
    .catch((error: Error) => ({ success: false, stderr: new TextEncoder().encode(error.message) }));
  if (built.success) return { ok: true };
  return {
    ok: false,
    said: new TextDecoder().decode(built.stderr).trim().split("\n").slice(-3).join(" / "),
  };
}

/**
 * Decides readiness: ready when the engine has every image; each missing image this project
 * builds gets its script run once (one at a time: both compete for the same two cores) and the
 * engine is asked again; a failed build, or an image no script makes, says what to run.
 *
 * @example
 * ```ts ignore
 * await decideReadiness({ probe, build }); // { ready: true } or { ready: false, why }
 * ```
 */
export async function decideReadiness(
  { probe, build }: ReadinessSteps = { probe: probeEngine, build: runBuild },
): Promise<DockerReadiness> {
  const first = await probe();
  if ("down" in first) return { ready: false, why: first.down };
  if (first.missing.length === 0) return { ready: true };
  const unbuildable = first.missing.filter((m) => buildCommandOf(m.image) === null);
  if (unbuildable.length) {
    return { ready: false, why: unbuildable.map((m) => m.message).join("; ") };
  }
  for (const missing of first.missing) {
    const command = buildCommandOf(missing.image)!;
    console.log(
      `docker suites: ${missing.message}: building it now with ${command.join(" ")} ` +
        "(once; seconds for minimal, about a minute for the Debian base)",
    );
    const built = await build(command);
    if (!built.ok) {
      return {
        ready: false,
        why: `${missing.message}, and building it failed (${built.said}): run ` +
          `'bash ${command.join(" ")}' (as root: it installs what it needs with apt-get)`,
      };
    }
  }
  const second = await probe();
  if ("down" in second) return { ready: false, why: second.down };
  if (second.missing.length) {
    return { ready: false, why: second.missing.map((m) => m.message).join("; ") };
  }
  return { ready: true };
}

let decided: Promise<DockerReadiness> | undefined;

/**
 * Whether the docker suites can run here, decided once per test process (building missing
 * images on the way).
 *
 * @example
 * ```ts ignore
 * const readiness = await dockerReadiness();
 * if (!readiness.ready) console.log(`skipped: ${readiness.why}`);
 * ```
 */
export function dockerReadiness(): Promise<DockerReadiness> {
  return decided ??= decideReadiness();
}

/** Registers one case of a docker suite; see {@linkcode dockerSuite}. */
export type DockerTest = (name: string, fn: () => Promise<void>) => void;

/**
 * The `Deno.test` of a suite whose cases need the engine: where Docker is not ready they are
 * skipped, saying why once under `suite`, except on CI (`CI=true`), where they run and fail
 * naming why.
 *
 * @example
 * ```ts ignore
 * const dockerTest = await dockerSuite("build_test");
 * dockerTest("DockerExecutor builds a template", async () => {});
 * ```
 */
export async function dockerSuite(suite: string): Promise<DockerTest> {
  const onCi = Deno.env.get("CI") === "true";
  const readiness = await dockerReadiness();
  const notReady = readiness.ready ? null : readiness.why;
  if (notReady && !onCi) console.log(`docker ${suite}: skipped: ${notReady}`);
  return (name, fn) =>
    Deno.test({
      name,
      ignore: notReady !== null && !onCi,
      // dockerode's node:http agent keeps its unix sockets to the engine open between calls.
      sanitizeOps: false,
      sanitizeResources: false,
      fn: async () => {
        if (notReady) throw new Error(`CI=true, so the Docker cases must run, but ${notReady}`);
        await fn();
      },
    });
}
