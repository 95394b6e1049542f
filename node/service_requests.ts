/**
 * How the service reads a request against its rows and answers it: a listing's filter, a
 * command's environment and answer, a name's template, a merge of metadata.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import { metadataSchema } from "../shared/schemas.ts";
import type { ExecRequest } from "./executors/contract.ts";
import { identityEnv } from "./sandbox_identity.ts";
import type { ExecResult, ListFilter, SandboxRecord } from "./service_contract.ts";

/** Whether a row matches a listing's filter. */
export function matcher(filter: ListFilter): (s: SandboxRecord) => boolean {
  const wanted = Object.entries(filter.metadata ?? {});
  return (s) =>
    (filter.team === undefined || s.team === filter.team) &&
    (!filter.states || filter.states.includes(s.state)) &&
    wanted.every(([k, v]) => s.metadata[k] === v);
}

/**
 * The command with the sandbox's recorded env under its own: a claimed warm sandbox's container
 * was built before its env was known, so the env travels with every command instead. The
 * identity variables (`E2B_SANDBOX`, `E2B_SANDBOX_ID`, ...) go over the sandbox's env, as envd
 * sets them over the create's `envs`, and under the command's own env, as envd starts a process.
 */
export function withEnv(sandbox: SandboxRecord, request: ExecRequest): ExecRequest {
  return { ...request, env: { ...sandbox.env, ...identityEnv(sandbox), ...request.env } };
}

/**
 * A name keeps the template it was built from: a create-or-wake that names another one must not
 * quietly wake the old machine (its tools, image and files are not what the caller asked for).
 * Names are ours, not E2B's, so the rule is ours: refuse, and say both ways out.
 */
export function refuseOtherTemplate(existing: SandboxRecord, asked: string | undefined): void {
  if (asked === undefined || asked === existing.template) return;
  throw new HttpError(
    409,
    `Sandbox '${existing.name}' exists with template '${existing.template}', and this request ` +
      `asks for template '${asked}': a name keeps the template it was built from, so destroy ` +
      `it first (destroySandbox, or kill it) to build '${asked}' under that name, or use ` +
      `another name (or ask for '${existing.template}', or for no template, to wake it)`,
  );
}

/**
 * `next`, the metadata `sandbox` is to hold, once within the schema's bounds. Each request is
 * bounded by the schema; a merge is bounded here, or merges would grow it.
 *
 * @throws {HttpError} 400 when it is past the schema's bounds.
 */
export function boundedMetadata(
  sandbox: SandboxRecord,
  next: Record<string, string>,
): Record<string, string> {
  const bounded = metadataSchema.safeParse(next);
  if (!bounded.success) {
    throw new HttpError(
      400,
      `The merged metadata of '${sandbox.name}' ${bounded.error.issues[0].message}: ` +
        "merge fewer keys, or replace the metadata (merge: false)",
    );
  }
  return next;
}

/**
 * The answer of a command run to the end.
 *
 * @throws {HttpError} 410 when the sandbox was destroyed while the command ran.
 */
export function execAnswer(
  sandbox: SandboxRecord,
  out: { text: string; truncated: boolean },
  err: { text: string; truncated: boolean },
  exit: { exitCode: number; timedOut?: boolean; sandboxDestroyed?: boolean },
): ExecResult {
  if (exit.sandboxDestroyed) {
    throw new HttpError(
      410,
      `Sandbox '${sandbox.name}' was destroyed while the command ran (destroySandbox, a kill ` +
        "or its deadline), and the command with it: create it again to run commands",
    );
  }
  return {
    exitCode: exit.exitCode,
    stdout: out.text,
    stderr: err.text,
    stdoutTruncated: out.truncated,
    stderrTruncated: err.truncated,
    ...(exit.timedOut ? { timedOut: true } : {}),
  };
}
