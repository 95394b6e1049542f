/**
 * What a sandbox knows of itself, as E2B's envd tells it: `E2B_SANDBOX=true`, `E2B_SANDBOX_ID`,
 * `E2B_TEMPLATE_ID` and `E2B_TEAM_ID` in every command's environment, and the same values in
 * `/run/e2b/.E2B_SANDBOX`, `.E2B_SANDBOX_ID`, `.E2B_TEMPLATE_ID` and `.E2B_TEAM_ID` (no trailing
 * newline), for programs not started through envd. The values are the sandbox's own: a fork or
 * a sandbox started from a snapshot has its own id, not its origin's; a resumed sandbox keeps
 * its id; a warm sandbox handed out keeps the id it was built under, which is the id it is
 * answered with.
 *
 * @module
 */
import type { Executor } from "./executors/contract.ts";
import type { SandboxRecord } from "./service_contract.ts";

/** Where the identity files are written in the sandbox. */
export const IDENTITY_DIR = "/run/e2b";

/** The longest the write of the identity files may take before it is given up. */
export const IDENTITY_WRITE_TIMEOUT_MS = 15_000;

/** The identity variables of a sandbox, by name. */
export function identityEnv(
  sandbox: Pick<SandboxRecord, "id" | "template" | "team">,
): Record<string, string> {
  return {
    E2B_SANDBOX: "true",
    E2B_SANDBOX_ID: sandbox.id,
    E2B_TEMPLATE_ID: sandbox.template,
    E2B_TEAM_ID: sandbox.team,
  };
}

/**
 * The sh script that writes the identity files from the variables of the same names (values
 * travel in the environment, never spliced into the script).
 */
export const IDENTITY_SCRIPT: string = [
  `mkdir -p ${IDENTITY_DIR}`,
  ...Object.keys(identityEnv({ id: "", template: "", team: "" })).map((name) =>
    `printf '%s' "$${name}" > ${IDENTITY_DIR}/.${name}`
  ),
].join(" && ");

/**
 * Writes the identity files into the sandbox, as root. Resolves false (after `onFailure`) when
 * the write failed or did not end within `timeoutMs`: the sandbox still runs, and every command
 * still gets the variables.
 */
export async function writeIdentityFiles(
  executor: Executor,
  sandbox: Pick<SandboxRecord, "id" | "template" | "team">,
  onFailure: (why: string) => void,
  timeoutMs: number = IDENTITY_WRITE_TIMEOUT_MS,
): Promise<boolean> {
  try {
    const run = await executor.exec(sandbox.id, {
      cmd: ["/bin/sh", "-c", IDENTITY_SCRIPT],
      env: identityEnv(sandbox),
      user: "root",
      timeoutMs,
    });
    const [exit, , err] = await Promise.all([
      run.exited,
      new Response(run.stdout).arrayBuffer(),
      new Response(run.stderr).text(),
    ]);
    if (exit.exitCode === 0) return true;
    onFailure(
      `the write exited ${exit.exitCode}${exit.timedOut ? " (timed out)" : ""}: ` +
        err.slice(0, 500).trim(),
    );
  } catch (error) {
    onFailure((error as Error)?.message ?? String(error));
  }
  return false;
}
