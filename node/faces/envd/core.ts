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
import {
  type BodyCapOptions,
  DEFAULT_JSON_BODY_LIMIT_BYTES,
  DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
  MESSAGE_ALTERNATIVE,
} from "../../../shared/json_body.ts";
import { UploadSlots } from "./upload_slots.ts";
import { UploadStaging } from "./staging.ts";
import { DEFAULT_GZIP_MAX_RATIO } from "./gunzip.ts";

/** Default cap of one `POST /files` upload: 1 GiB, counted after decompression. */
export const DEFAULT_UPLOAD_LIMIT_BYTES = 1024 ** 3;

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
  /**
   * Largest upload `POST /files` accepts, bytes, counted after decompression (default
   * {@linkcode DEFAULT_UPLOAD_LIMIT_BYTES}). Uploads stream to the executor, so this bounds
   * what one upload may put in a sandbox (and stage on the data disk), not memory.
   */
  maxUploadBytes?: number;
  /**
   * The most a gzip upload (`Content-Encoding: gzip`) may grow when inflated, as a multiple of
   * its compressed size, 1 to 1032 (default {@linkcode DEFAULT_GZIP_MAX_RATIO}, 100); the first
   * MiB of output is allowed whatever the ratio. Past it the upload is a 413.
   */
  maxGzipRatio?: number;
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
  /**
   * Cap of every other Connect request, bytes (default `DEFAULT_JSON_MESSAGE_LIMIT_BYTES`, 1 MiB,
   * `DORMICE_JSON_MESSAGE_LIMIT_KB`): only `process.Process/SendInput` carries data (a
   * command's stdin) and takes up to `maxJsonBodyBytes`, read a slice at a time.
   */
  maxJsonMessageBytes?: number;
  /**
   * The bound on uploads streaming at once; pass one instance to every `/files` door of a node
   * (`createEnvd` and `handleSignedFiles`) so the bound is the node's. A fresh `UploadSlots()`
   * per door when absent.
   */
  uploads?: UploadSlots;
  /**
   * Where uploads wait between the client and the executor; pass one instance to every door
   * (`createNodeApp` stages under `<DORMICE_DATA_DIR>/uploads`). A fresh `UploadStaging()` (a
   * temporary directory) per door when absent.
   */
  staging?: UploadStaging;
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

/** The RPCs whose request carries data (a command's stdin), under the larger cap. */
const DATA_RPCS = new Set(["process.Process/SendInput"]);

/**
 * The cap of a Connect request body, as the shared reader takes it: the 413 names the node's
 * variable. `flat` says the body is read a slice at a time as one object of a few fields.
 */
export function jsonBodyCap(core: EnvdCore, route: string): BodyCapOptions & { flat: boolean } {
  if (DATA_RPCS.has(route)) {
    return {
      maxBytes: core.options.maxJsonBodyBytes,
      capVariable: "DORMICE_JSON_BODY_LIMIT_MB",
      flat: true,
    };
  }
  return {
    maxBytes: core.options.maxJsonMessageBytes,
    capVariable: "DORMICE_JSON_MESSAGE_LIMIT_KB",
    tooLargeHint: MESSAGE_ALTERNATIVE,
    flat: false,
  };
}

/** Fills in the defaults of `options`. */
export function makeCore(ops: SandboxOps, options: EnvdOptions): EnvdCore {
  return {
    ops,
    options: {
      accessTokens: options.accessTokens,
      log: options.log ?? silentLog,
      clock: options.clock ?? systemClock,
      maxUploadBytes: options.maxUploadBytes ?? DEFAULT_UPLOAD_LIMIT_BYTES,
      maxGzipRatio: options.maxGzipRatio ?? DEFAULT_GZIP_MAX_RATIO,
      maxWatchesPerSandbox: options.maxWatchesPerSandbox ?? 16,
      maxJsonBodyBytes: options.maxJsonBodyBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES,
      maxJsonMessageBytes: options.maxJsonMessageBytes ?? DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
      uploads: options.uploads ?? new UploadSlots(),
      staging: options.staging ?? new UploadStaging(),
    },
  };
}
