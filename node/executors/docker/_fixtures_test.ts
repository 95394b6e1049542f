/**
 * One answer, for every docker suite, to "can the Docker half run here?": an engine must answer
 * and every template image must exist. An engine without the images gets them built once
 * (`deploy/images/build-base.sh`, seconds, no registry), so a contributor with Docker exercises
 * Docker instead of failing or silently skipping.
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { DockerExecutor } from "./mod.ts";

/** Whether the Docker half can run, and why not. */
export type DockerReadiness = { ready: true } | { ready: false; why: string };

const buildScript = fileURLToPath(new URL("../../../deploy/images/build-base.sh", import.meta.url));

/** The engine's answer: null when it is down, else the template images it lacks. */
async function probeEngine(): Promise<{ down: string } | { missing: string[] }> {
  const missing: string[] = [];
  try {
    const executor = await DockerExecutor.connect({
      nodeId: "readiness-probe",
      callTimeoutMs: 3_000,
      // connect() warns, rather than refuses, for a template image that is not built.
      log: (level, msg) => level === "warn" && missing.push(msg),
    });
    await executor.close();
    return { missing };
  } catch (error) {
    return { down: error instanceof Error ? error.message : String(error) };
  }
}

/** What {@linkcode decideReadiness} needs: a look at the engine, and a way to build the images. */
export interface ReadinessSteps {
  /** The engine's answer: down (why), or the template images it lacks. */
  probe(): Promise<{ down: string } | { missing: string[] }>;
  /** Builds the images; the last lines it printed when it failed. */
  build(): Promise<{ ok: true } | { ok: false; said: string }>;
}

async function buildImages(): Promise<{ ok: true } | { ok: false; said: string }> {
  const built = await new Deno.Command("bash", {
    args: [buildScript],
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
 * Decides readiness: ready when the engine has every image; an engine lacking some gets them
 * built once and is asked again; a failed build says what to run.
 *
 * @example
 * ```ts ignore
 * await decideReadiness({ probe, build }); // { ready: true } or { ready: false, why }
 * ```
 */
export async function decideReadiness(
  { probe, build }: ReadinessSteps = { probe: probeEngine, build: buildImages },
): Promise<DockerReadiness> {
  const first = await probe();
  if ("down" in first) return { ready: false, why: first.down };
  if (first.missing.length === 0) return { ready: true };
  console.log(
    `docker suites: ${first.missing.join("; ")}: building it now with ${buildScript} (seconds)`,
  );
  const built = await build();
  if (!built.ok) {
    return {
      ready: false,
      why: `${first.missing.join("; ")}, and building it failed (${built.said}): run ` +
        `'bash deploy/images/build-base.sh' (as root, it installs busybox-static)`,
    };
  }
  const second = await probe();
  if ("down" in second) return { ready: false, why: second.down };
  if (second.missing.length) return { ready: false, why: second.missing.join("; ") };
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
