/**
 * What every part of the envd face shares: its options with their defaults and the sandbox's
 * header.
 *
 * @module
 */
import { type Clock, systemClock } from "../../../shared/clock.ts";
import { type Log, silentLog } from "../../../shared/log.ts";
import type { SandboxOps } from "../../service_contract.ts";
import type { AccessTokens } from "../../../shared/access_tokens.ts";
import { type BodyCapOptions, DEFAULT_JSON_BODY_LIMIT_BYTES } from "../../../shared/json_body.ts";

/** Options of `createEnvd` and `handleSignedFiles`. */
export interface EnvdOptions {
  /**
   * Per-sandbox access tokens. When set, every sandbox has a token and envd requires it as
   * `X-Access-Token` (or a valid `/files` signature); when absent, envd is open to whoever can
   * reach it (the fleet token guards only the control plane).
   */
  accessTokens?: AccessTokens;
  /** Where errors the client cannot fix are logged; `silentLog` when absent. */
  log?: Log;
  /** The time a signed URL's expiry is checked against; `systemClock` when absent. */
  clock?: Clock;
  /** Largest upload accepted by `POST /files`, bytes (default 1 GiB: files are held in memory). */
  maxUploadBytes?: number;
  /**
   * Directory watches (`WatchDir`, `CreateWatcher`) one sandbox may have at once (16 by
   * default): on Docker each is a process in the sandbox that looks at the directory 4 times a
   * second.
   */
  maxWatchesPerSandbox?: number;
  /**
   * Cap of a Connect request body, unary or stream, bytes (default
   * `DEFAULT_JSON_BODY_LIMIT_BYTES`, 32 MiB): an RPC's request is one JSON message.
   */
  maxJsonBodyBytes?: number;
}

/** The header the SDK names the sandbox with. */
export const SANDBOX_HEADER = "E2b-Sandbox-Id";

/** E2B's default user when the request names none. */
export const DEFAULT_USER = "user";

/** The state one mounted envd (or one signed `/files` door) works with. */
export interface EnvdCore {
  /** The sandbox service every route calls. */
  ops: SandboxOps;
  /** The options with their defaults filled in (the access tokens stay optional). */
  options: Required<Omit<EnvdOptions, "accessTokens">> & { accessTokens?: AccessTokens };
}

/**
 * The cap of a Connect request body, as the shared reader takes it: the 413 names the node's
 * variable.
 */
export function jsonBodyCap(core: EnvdCore): BodyCapOptions {
  return { maxBytes: core.options.maxJsonBodyBytes, capVariable: "DORMICE_JSON_BODY_LIMIT_MB" };
}

/** Fills in the defaults of `options`. */
export function makeCore(ops: SandboxOps, options: EnvdOptions): EnvdCore {
  return {
    ops,
    options: {
      accessTokens: options.accessTokens,
      log: options.log ?? silentLog,
      clock: options.clock ?? systemClock,
      maxUploadBytes: options.maxUploadBytes ?? 1024 ** 3,
      maxWatchesPerSandbox: options.maxWatchesPerSandbox ?? 16,
      maxJsonBodyBytes: options.maxJsonBodyBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES,
    },
  };
}
