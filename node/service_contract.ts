/**
 * The node's sandbox service contract: what the native face and the E2B faces call. The
 * implementation (`SandboxService`) runs every single-sandbox verb inside that name's NameQueue
 * slot and keeps the ledger and the executor in step.
 *
 * @module
 */
import type { LookupAnswer, LookupRequest, Sandbox, SandboxSpec } from "../shared/schemas.ts";
import type { EgressRules } from "../shared/egress_rules.ts";
import type {
  DirWatch,
  ExecHandle,
  ExecRequest,
  FileEntry,
  FileOptions,
  FileStream,
  FsChange,
  SandboxLimits,
  SandboxStats,
  WatchRequest,
  WriteOptions,
} from "./executors/contract.ts";

/** What a deadline does when it passes (E2B: kill, or pause with `autoPause`). */
export type DeadlineAction = "kill" | "pause";

/**
 * What the node keeps of an E2B create's options, for the timeout, the resume by traffic and
 * the sandbox's info. A native sandbox has none (`{}`).
 */
export interface E2bSettings {
  /** What the deadline does (`lifecycle.onTimeout`, or `autoPause`); absent: not an E2B create. */
  onTimeout?: DeadlineAction;
  /** Traffic through envd resumes the sandbox when it is paused (`lifecycle.autoResume`). */
  autoResume?: boolean;
  /** The lifetime the create gave, seconds: a resume by traffic gets it again. */
  timeoutSeconds?: number;
  /**
   * `secure` as the create asked. Recorded only: envd here always requires the sandbox's access
   * token, which is all `secure` asks in E2B (it does not close the ports).
   */
  secure?: boolean;
  /** `allowInternetAccess` as the create set it; absent when it did not. */
  allowInternetAccess?: boolean;
  /**
   * `network.allowPublicTraffic` as the create set it; `false` makes the ports require the
   * traffic access token.
   */
  allowPublicTraffic?: boolean;
  /**
   * `network.maskRequestHost`: the Host the sandbox's servers see on port traffic, `${PORT}`
   * standing for the port; absent, they see the node's address of the sandbox.
   */
  maskRequestHost?: string;
  /**
   * `false`: a `pause` deadline pauses the file system only (`lifecycle.onTimeout: {action:
   * "pause", keepMemory: false}`, sent as `autoPauseMemory: false`); absent keeps the memory.
   */
  keepMemory?: false;
}

/** A ledger row as the service hands it out: the public sandbox plus E2B bookkeeping. */
export interface SandboxRecord extends Sandbox {
  /** Default environment of every command (E2B `envVars`, native `spec.env`). */
  env: Record<string, string>;
  /** E2B deadline, ms since the epoch; `null` when the sandbox has none (native sandboxes). */
  deadlineAt: number | null;
  /** What the scanner does past the deadline. */
  deadlineAction: DeadlineAction | null;
  /** The E2B create's options the node keeps; `{}` for a native sandbox. */
  e2b: E2bSettings;
}

/** `acquire` input: create-or-wake by name. */
export interface AcquireRequest {
  /** The sandbox name to create or wake; with the team, the key of its NameQueue slot. */
  name: string;
  /** The team the sandbox belongs to (the default team when absent); names are per team. */
  team?: string;
  /**
   * Template to build from on create (the service's `defaultTemplate` when absent). On wake,
   * absent means whatever the sandbox was built from; another template than that is a 409, since
   * waking it would hand the caller a machine it did not ask for.
   */
  template?: string;
  /**
   * A snapshot id the executor holds, of this team (the caller checks): a create starts from its
   * file system instead of the template's (no warm pool serves it). Ignored on wake.
   */
  snapshot?: string;
  /** Caller's key/value labels, stored on create; ignored on wake. */
  metadata?: Record<string, string>;
  /** Resource limits asked on create; ignored on wake. */
  spec?: SandboxSpec;
  /** Default environment (E2B `envVars`), merged over `spec.env` on create. */
  env?: Record<string, string>;
  /** Sets an E2B deadline `deadlineMs` from now (also refreshed on wake when given). */
  deadline?: { ms: number; action: DeadlineAction };
  /**
   * The E2B create's options, stored on create; on wake only the lifecycle (`onTimeout`,
   * `autoResume`, `timeoutSeconds`) is replaced, since a built sandbox keeps its network.
   */
  e2b?: E2bSettings;
  /**
   * The slot token of the gateway's take of the name (`x-dormice-slot-token`, shared mode): a
   * build is refused (409) when a larger one was seen for the name. Absent, nothing is fenced.
   */
  slotToken?: number;
  /**
   * True for a create that did not come through a gateway (no `x-dormice-hop` header): the
   * node makes it known with a check-in before it builds and again before it answers
   * (`ServiceOptions.announceDirect`, docs/lookup-digest.md).
   */
  direct?: boolean;
}

/** What `acquire` answers: the row, and whether this call built it. */
export interface AcquireResult {
  /** True when this call built the sandbox, false when it existed (and was woken if needed). */
  created: boolean;
  /** The sandbox's row after the call, active. */
  sandbox: SandboxRecord;
}

/** A buffered command's answer (native `execCommand`). */
export interface ExecResult {
  /** The exit code; 128 + signal number when killed by a signal, -1 when unknown. */
  exitCode: number;
  /** Standard output as UTF-8 (what is not UTF-8 becomes U+FFFD), cut at `maxOutputBytes`. */
  stdout: string;
  /** Standard error as UTF-8 (what is not UTF-8 becomes U+FFFD), cut at `maxOutputBytes`. */
  stderr: string;
  /** True when stdout went past `maxOutputBytes` and the rest was dropped. */
  stdoutTruncated: boolean;
  /** True when stderr went past `maxOutputBytes` and the rest was dropped. */
  stderrTruncated: boolean;
  /** True when `timeoutMs` ran out and the command was killed (absent otherwise). */
  timedOut?: boolean;
}

/** Selects sandboxes for `list`. */
export interface ListFilter {
  /** Only this team's sandboxes; every team's when absent. */
  team?: string;
  /** Every key/value must match the sandbox's metadata. */
  metadata?: Record<string, string>;
  /** Only these states. */
  states?: Sandbox["state"][];
}

/**
 * The sandbox service. `ref` arguments name a sandbox by `{ name }` or `{ id }`; an unknown
 * sandbox throws `HttpError(404)` with a sentence. Verbs that run code or touch files wake a
 * frozen sandbox first and touch its idle clock; `lookup` and `get` never wake or touch.
 */
export interface SandboxOps {
  /** Create-or-wake by name. */
  acquire(request: AcquireRequest): Promise<AcquireResult>;
  /** The row, or undefined; never wakes. */
  get(ref: SandboxRef): SandboxRecord | undefined;
  /** Every row matching the filter. */
  list(filter?: ListFilter): SandboxRecord[];
  /**
   * Every row matching the filter, read a page at a time with the event loop let run between
   * pages: what a listing answered to a client uses.
   */
  listInSlices(filter?: ListFilter): Promise<SandboxRecord[]>;
  /** Every sandbox's id, read without decoding the rows. */
  ids(): string[];
  /** The three-step lookup (row at once; busy slot: wait and look again; else a plain no). */
  lookup(request: LookupRequest, team?: string, slotToken?: number): Promise<LookupAnswer>;
  /**
   * Runs a command to the end, buffering output up to the cap; past `timeoutMs` it is killed
   * (`timedOut`). A 410 when the sandbox is destroyed while it runs.
   */
  execCommand(
    ref: SandboxRef,
    request: ExecRequest & { maxOutputBytes?: number },
  ): Promise<ExecResult>;
  /** Starts a streamed command (E2B `Process/Start`); the handle is tracked until it exits. */
  startCommand(ref: SandboxRef, request: ExecRequest): Promise<ExecHandle>;
  /** Running commands of a sandbox started with `startCommand`, by pid. */
  commands(ref: SandboxRef): Map<number, { handle: ExecHandle; request: ExecRequest }>;
  /**
   * Writes a whole file, creating parent directories; binary-safe (wakes first). A
   * {@linkcode FileStream} is read inside the sandbox's slot, so give one that flows at disk
   * speed (an upload staged first), never a client's body at the client's pace.
   */
  writeFile(
    ref: SandboxRef,
    path: string,
    data: Uint8Array | FileStream,
    options?: WriteOptions,
  ): Promise<FileEntry>;
  /** Reads a whole file; binary-safe (wakes first). */
  readFile(ref: SandboxRef, path: string, options?: FileOptions): Promise<Uint8Array>;
  /** Lists a directory down to `depth` levels, 1 = its own children (wakes first). */
  listDir(
    ref: SandboxRef,
    path: string,
    depth?: number,
    options?: FileOptions,
  ): Promise<FileEntry[]>;
  /** Describes one path (wakes first). */
  stat(ref: SandboxRef, path: string, options?: FileOptions): Promise<FileEntry>;
  /** Creates a directory and its parents; resolves false when it already existed (wakes first). */
  makeDir(ref: SandboxRef, path: string, options?: FileOptions): Promise<boolean>;
  /** Renames `from` to `to`; resolves the entry at its new path (wakes first). */
  move(ref: SandboxRef, from: string, to: string, options?: FileOptions): Promise<FileEntry>;
  /** Removes a file or a directory tree; a missing path is not an error (wakes first). */
  remove(ref: SandboxRef, path: string, options?: FileOptions): Promise<void>;
  /**
   * Watches a directory for changes by anyone (wakes first); see `Executor.watch`. The watch
   * ends when stopped or when the sandbox is destroyed.
   */
  watch(
    ref: SandboxRef,
    request: WatchRequest,
    onChange: (change: FsChange) => void,
  ): Promise<DirWatch>;
  /** Replaces (or merges, with `merge: true`) the metadata. */
  updateMetadata(
    ref: SandboxRef,
    metadata: Record<string, string>,
    merge?: boolean,
  ): Promise<SandboxRecord>;
  /**
   * Replaces the egress address rules of a sandbox with egress, without restarting it; throws
   * `HttpError(409)` for a sandbox without egress or a node that cannot enforce rules.
   */
  updateEgressRules(ref: SandboxRef, rules: EgressRules): Promise<SandboxRecord>;
  /**
   * Freezes a sandbox (`frozen`), or with `keepMemory: false` keeps only its file system and
   * removes the rest (`archived`: no memory, no CPU held); throws `HttpError(409)` when it is
   * already paused either way.
   */
  pause(ref: SandboxRef, options?: { keepMemory?: boolean }): Promise<SandboxRecord>;
  /**
   * Wakes a frozen sandbox, or restores an archived one from its files under the same id;
   * resolves `resumed: false` when it was already running.
   */
  resume(ref: SandboxRef): Promise<{ resumed: boolean; sandbox: SandboxRecord }>;
  /** Sets or clears the E2B deadline. */
  setDeadline(ref: SandboxRef, deadlineAt: number | null, action?: DeadlineAction): SandboxRecord;
  /** Destroys; resolves false when there was no such sandbox. */
  destroy(ref: SandboxRef): Promise<boolean>;
  /** Resource use of one sandbox. */
  metrics(ref: SandboxRef): Promise<SandboxStats>;
  /**
   * The sandbox's recent samples taken from `fromMs` to `toMs` (ms since the epoch, both
   * included), oldest first; never wakes.
   */
  metricsHistory(ref: SandboxRef, fromMs?: number, toMs?: number): Promise<SandboxStats[]>;
  /** The cpu and memory the sandbox was given (its spec's, else the executor's defaults). */
  limits(sandbox: SandboxRecord): SandboxLimits;
  /**
   * The door traffic passes to reach a sandbox (envd now, its ports later): a running sandbox
   * as it is; a paused one woken when its lifecycle allows (`autoResume`, or a native sandbox,
   * which wakes on use) with its E2B deadline renewed; `null` when it is paused and stays so.
   */
  wakeForTraffic(ref: SandboxRef): Promise<SandboxRecord | null>;
}

/**
 * Names a sandbox by name or by ledger id. `team` scopes it: a name is looked up within that
 * team (the default team when absent); an id answers only for a sandbox of that team (any team
 * when absent, as for the operator), so another team's sandbox is a 404 as if absent.
 */
export type SandboxRef = { name: string; team?: string } | { id: string; team?: string };
