/**
 * The executor contract: the only place that touches containers. `FakeExecutor` (in memory)
 * and `DockerExecutor` (dockerode) implement it; the same contract suite runs against both.
 * The one error type executors throw, the HTTP status of each of its codes and the sentences of
 * its common cases are in `errors.ts`, re-exported here.
 *
 * @module
 */
import type { SandboxSpec } from "../../shared/schemas.ts";
import type { EgressRules } from "../../shared/egress_rules.ts";
import { ExecutorError } from "./errors.ts";

export {
  egressRulesUnserved,
  ExecutorError,
  type ExecutorErrorCode,
  executorErrorStatus,
  executorErrorToHttp,
  noEgress,
  snapshotNameTaken,
  snapshotNotFound,
  unknownVolume,
} from "./errors.ts";

/** What an executor is told when it builds a sandbox. */
export interface CreateRequest {
  /** The ledger id; executors label or key their resources by it. */
  id: string;
  /** The sandbox name (for labels and logs only). */
  name: string;
  /** The template (an image name for Docker). */
  template: string;
  /** Limits (cpus, memory, pids), network access and extra environment, as the create asked. */
  spec: SandboxSpec;
  /** Default environment for every command in the sandbox. */
  env: Record<string, string>;
  /**
   * A snapshot id this executor holds: the sandbox starts with that snapshot's file system
   * instead of the template's (`template` then only names it in labels and answers). The
   * caller has checked the snapshot belongs to the creating team.
   */
  snapshot?: string;
  /**
   * The team it belongs to (absent for a warm sandbox before it is claimed): the egress proxy
   * shares its connections between teams first, so one team's many sandboxes cannot take them
   * all.
   */
  team?: string;
}

/** What a snapshot is taken as. */
export interface SnapshotRequest {
  /** The team it belongs to: only that team lists it, finds it and starts sandboxes from it. */
  team: string;
  /**
   * A name unique within the team (`exists` when taken, unless `rebuild`); unnamed when
   * absent.
   */
  name?: string;
  /**
   * A name the team already uses here is a new build of that snapshot, as E2B's
   * `createSnapshot({name})` is: the result keeps that snapshot's id and replaces it.
   */
  rebuild?: boolean;
  /**
   * The id to keep the result under: the team's snapshot by `name` that another node holds (the
   * gateway looked it up), so one name stays one id across the fleet. A new id when absent and
   * the name is new here.
   */
  snapshotId?: string;
}

/**
 * A snapshot: a sandbox's file system as it was when taken (never its memory or processes),
 * kept on the node that took it after the sandbox is gone.
 */
export interface SnapshotInfo {
  /** Its id, `snap-` and 20 lowercase letters or digits, unique across the fleet. */
  snapshotId: string;
  /** Its team. */
  team: string;
  /** Its name within the team, when it was given one. */
  name?: string;
  /** The sandbox it was taken from (which may be gone since). */
  sandboxId: string;
  /** The template that sandbox was built from. */
  template: string;
  /** The node that took it. */
  node: string;
  /** When it was taken, ms since the epoch. */
  createdAt: number;
  /** Bytes it holds on the node's disk beyond its template (0 when unknown). */
  sizeBytes: number;
  /**
   * A built template its team published (`PATCH /v2/templates/{id}`): every team lists it,
   * finds it by name and id, and starts sandboxes from it; only its own team deletes it.
   */
  public?: boolean;
}

/** An image streamed out of an executor for another node (see `Executor.exportImage`). */
export interface ImageExport {
  /**
   * What identifies its content, which the receiver checks what it loaded against (Docker: the
   * image id, `sha256:` and 64 hex digits, the digest of its configuration).
   */
  digest: string;
  /** The bytes (Docker: a `docker save` tar); cancel it to stop the export. */
  body: ReadableStream<Uint8Array>;
}

/** The shape of a snapshot id: what a create's template is read as a snapshot by. */
export const SNAPSHOT_ID_PATTERN: RegExp = /^snap-[a-z0-9]{20}$/;

/**
 * A new snapshot id: `snap-` and 20 random lowercase letters or digits (about 103 bits).
 *
 * @example
 * ```ts
 * import { newSnapshotId, SNAPSHOT_ID_PATTERN } from "./contract.ts";
 * SNAPSHOT_ID_PATTERN.test(newSnapshotId()); // true
 * ```
 */
export function newSnapshotId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  return `snap-${Array.from(bytes, (b) => alphabet[b % alphabet.length]).join("")}`;
}

/** How to run one command. */
export interface ExecRequest {
  /** argv: `["/bin/bash", "-l", "-c", "echo hi"]`, or `["sh", "-c", cmd]`. */
  cmd: string[];
  /** Working directory; the executor's home when absent. */
  cwd?: string;
  /** Extra environment, over the sandbox's default environment. */
  env?: Record<string, string>;
  /** Run-as user (E2B sends one); executors may ignore it where they cannot switch. */
  user?: string;
  /** Keep stdin open for `writeStdin`; closed at once otherwise. */
  stdin?: boolean;
  /** Kill the command after this many ms (the exit then reports `timedOut`). */
  timeoutMs?: number;
  /**
   * Run the command on a terminal of this size (E2B's PTY): everything the terminal shows,
   * standard error included, comes on `stdout`, stdin is the terminal's input and is open
   * whatever `stdin` says, and `resize` changes the size.
   */
  tty?: TerminalSize;
}

/** A terminal's size in character cells. */
export interface TerminalSize {
  /** Columns, 1 to 65,535. */
  cols: number;
  /** Rows, 1 to 65,535. */
  rows: number;
}

/** How a command ended. */
export interface ExecExit {
  /** The exit code; 128 + signal number when killed by a signal, -1 when unknown. */
  exitCode: number;
  /** The signal name when killed by one, e.g. `"SIGKILL"`. */
  signal?: string;
  /** True when `timeoutMs` ran out and the executor killed it. */
  timedOut?: boolean;
  /**
   * True when the command ended because its sandbox was destroyed (set by the sandbox service,
   * which knows why; executors leave it out): the exit is the kill's, not the command's.
   */
  sandboxDestroyed?: boolean;
}

/** A running command: its output streams as they come, and its end. */
export interface ExecHandle {
  /** A per-sandbox process id, unique among that sandbox's running commands. */
  readonly pid: number;
  /** Standard output as it is produced; closes when the command ends. */
  readonly stdout: ReadableStream<Uint8Array>;
  /** Standard error as it is produced; closes when the command ends. */
  readonly stderr: ReadableStream<Uint8Array>;
  /**
   * Resolves when the command ended (never rejects for a non-zero exit). Rejects with an
   * `ExecutorError` (`unavailable`) when the executor lost the command before its end was
   * known, say its engine went away mid-run; the sentence says whether it was killed or may
   * still be running.
   */
  readonly exited: Promise<ExecExit>;
  /** Writes to stdin (only when started with `stdin: true`). */
  writeStdin(data: Uint8Array): Promise<void>;
  /** Closes stdin: a command reading it sees the end of its input. */
  closeStdin(): Promise<void>;
  /** Sends a signal; a command that already ended is not an error. */
  kill(signal?: "SIGKILL" | "SIGTERM" | "SIGINT" | "SIGHUP"): Promise<void>;
  /**
   * Changes the size of the command's terminal (the command gets SIGWINCH); `invalid` for a
   * command started without `tty`. A command that already ended is not an error.
   */
  resize(size: TerminalSize): Promise<void>;
}

/** One file-system entry, as `lstat` describes it (a symlink is described itself). */
export interface FileEntry {
  /** Base name. */
  name: string;
  /** Absolute path. */
  path: string;
  /** Kind of entry; devices, fifos and sockets are described as files. */
  type: "file" | "dir" | "symlink";
  /** Size in bytes as stat says: a directory's own (4096 on most file systems), a link's. */
  size: number;
  /** Unix permission bits with setuid, setgid and sticky, e.g. 0o644. */
  mode: number;
  /** Owner user name (the numeric id when the sandbox has no name for it). */
  owner: string;
  /** Owner group name (the numeric id when the sandbox has no name for it). */
  group: string;
  /** Last modification, ms since the epoch. */
  modifiedAt: number;
  /** Where a symlink leads, absolute, every hop followed (a broken one as far as it resolves). */
  symlinkTarget?: string;
  /** What a symlink leads to; absent for a broken one and for anything else. */
  targetType?: "file" | "dir";
  /** The permission bits of what a symlink leads to; absent when `targetType` is. */
  targetMode?: number;
  /**
   * The file's metadata, as envd keeps it: the `user.e2b.<key>` extended attributes, which
   * follow the file through renames and edits in place and go when a write replaces it. Absent
   * when there is none, and on an image without the tools to read them (`getfattr`).
   */
  metadata?: Record<string, string>;
}

/** Options every file verb takes. */
export interface FileOptions {
  /**
   * The run-as user (E2B sends one), mapped as `exec` maps it: `"root"`, else the sandbox's own
   * user. Relative paths start at that user's home; what `writeFile` and `makeDir` create is
   * owned by that user (created by the executor wherever envd, which runs as root, could);
   * `stat`, `listDir`, `move` and `remove` see the file system with that user's permissions.
   */
  user?: string;
}

/** What `writeFile` takes besides the run-as user. */
export interface WriteOptions extends FileOptions {
  /**
   * Metadata to keep with the written file (envd's `X-Metadata-<key>` headers): keys of HTTP
   * token characters, printable ASCII values. A write replaces the file and with it the old
   * metadata; an image that cannot keep it (no `setfattr`) refuses the write as `invalid`.
   */
  metadata?: Record<string, string>;
}

/** One change a directory watch reports, named as inotify (and so envd) names them. */
export interface FsChange {
  /** The changed path, absolute. */
  path: string;
  /** What happened to it; a rename reports the old path, and the new one as a create. */
  type: "create" | "write" | "remove" | "rename" | "chmod";
}

/** What a directory watch watches. */
export interface WatchRequest extends FileOptions {
  /** The directory, absolute or relative to the run-as user's home. */
  path: string;
  /** Changes anywhere below the directory, not only to its own entries. */
  recursive?: boolean;
}

/** A running directory watch. */
export interface DirWatch {
  /** Resolves when the watch ended: stopped, or its sandbox destroyed. */
  readonly ended: Promise<void>;
  /** Ends the watch; calling it again is not an error. */
  stop(): Promise<void>;
}

/**
 * A file's bytes as a stream of a known length: how an upload reaches an executor without being
 * held whole (the node stages it first, so the stream flows at disk speed, not the client's).
 * Docker needs the length up front for the archive's header.
 */
export interface FileStream {
  /** The number of bytes `stream` delivers; an executor refuses a stream that delivers another. */
  readonly size: number;
  /** The bytes. The executor reads it once, to its end, or cancels it when it gives up. */
  readonly stream: ReadableStream<Uint8Array>;
}

/**
 * The bytes of a {@linkcode FileStream}, read into memory: for an executor that keeps files in
 * memory anyway (the fake).
 *
 * @throws {ExecutorError} `invalid` when the stream delivers more or fewer bytes than `size`.
 * @example
 * ```ts
 * import { readFileStream } from "./contract.ts";
 * const stream = new Blob(["hi"]).stream();
 * await readFileStream({ size: 2, stream }); // Uint8Array [104, 105]
 * ```
 */
export async function readFileStream(data: FileStream): Promise<Uint8Array> {
  const bytes = new Uint8Array(data.size);
  let at = 0;
  for await (const chunk of data.stream) {
    if (at + chunk.length > data.size) {
      throw fileStreamLengthError(data.size, at + chunk.length, "at least");
    }
    bytes.set(chunk, at);
    at += chunk.length;
  }
  if (at !== data.size) throw fileStreamLengthError(data.size, at, "only");
  return bytes;
}

/**
 * The error of a stream that did not deliver the bytes it announced.
 *
 * @example
 * ```ts
 * import { fileStreamLengthError } from "./contract.ts";
 * fileStreamLengthError(10, 4, "only").code; // "invalid"
 * ```
 */
export function fileStreamLengthError(
  size: number,
  got: number,
  how: "only" | "at least",
): ExecutorError {
  return new ExecutorError(
    "invalid",
    `The file's stream announced ${size} bytes but delivered ${how} ${got}: send it again`,
  );
}

/** A host and port the node can open a TCP connection to. */
export interface PortAddress {
  /** An IP address (the container's, or loopback). */
  hostname: string;
  /** The TCP port. */
  port: number;
}

/** Resource use of one sandbox. */
export interface SandboxStats {
  /** Taken at, ms since the epoch. */
  takenAt: number;
  /** CPU used, percent of one core (may exceed 100 on several cores). */
  cpuUsedPct: number;
  /** Cores available to the sandbox. */
  cpuCount: number;
  /** Memory used, bytes. */
  memoryUsedBytes: number;
  /** Memory limit, bytes (0 when unlimited). */
  memoryLimitBytes: number;
  /** Disk used in the sandbox's writable layer, bytes (0 when unknown). */
  diskUsedBytes: number;
}

/** The cpu and memory a sandbox gets: what its spec asked, else the executor's defaults. */
export interface SandboxLimits {
  /** Cores (fractions allowed). */
  cpus: number;
  /** Memory, MiB. */
  memoryMB: number;
}

/** What an executor can serve now, for the check-in. */
export interface ExecutorCapabilities {
  /** Templates whose images it holds now; `undefined` when it serves any template. */
  templates?: string[];
  /** Declared volumes that are present now (a missing host directory is not advertised). */
  volumes: string[];
  /**
   * Whether it enforces egress address rules (`spec.egressRules`, `setEgressRules`); absent
   * or false, a create asking for them is refused and the gateway places it elsewhere.
   */
  egressRules?: boolean;
}

/**
 * The executor contract. Every method takes the ledger id of the sandbox. Calls for one sandbox
 * are serialised by the caller's NameQueue where the verb needs it; executors must still be safe
 * under concurrent calls for different sandboxes.
 */
export interface Executor {
  /** `"fake"` or `"docker"`. */
  readonly kind: string;
  /** Builds and starts the sandbox. */
  create(request: CreateRequest): Promise<void>;
  /**
   * The limits a sandbox built with `spec` gets (no engine call): the ones `create` applies and
   * `stats` reports, so a face can answer them without reading stats.
   */
  limits(spec: SandboxSpec): SandboxLimits;
  /**
   * Stops and removes the sandbox, and what `archive` kept of it; a sandbox that does not exist
   * is not an error.
   */
  destroy(id: string): Promise<void>;
  /** Starts a command; output streams as it comes. */
  exec(id: string, request: ExecRequest): Promise<ExecHandle>;
  /**
   * Writes a whole file, creating parent directories; binary-safe. `data` is the bytes, or a
   * {@linkcode FileStream} the executor reads as it writes (a large upload), holding a bounded
   * part of it. When the stream fails, its error is thrown as it came; the file may then hold
   * the bytes that arrived (Docker extracts as it receives, like envd writes), so give a stream
   * that cannot fail midway (an upload staged first) where a partial file matters.
   */
  writeFile(
    id: string,
    path: string,
    data: Uint8Array | FileStream,
    options?: WriteOptions,
  ): Promise<FileEntry>;
  /** Reads a whole file; binary-safe. */
  readFile(id: string, path: string, options?: FileOptions): Promise<Uint8Array>;
  /** Lists a directory's entries, down to `depth` levels (1 = the directory's own children). */
  listDir(id: string, path: string, depth?: number, options?: FileOptions): Promise<FileEntry[]>;
  /** Describes one path. */
  stat(id: string, path: string, options?: FileOptions): Promise<FileEntry>;
  /** Creates a directory and its parents; resolves false when it already existed. */
  makeDir(id: string, path: string, options?: FileOptions): Promise<boolean>;
  /** Renames `from` to `to`. */
  move(id: string, from: string, to: string, options?: FileOptions): Promise<FileEntry>;
  /** Removes a file or a directory tree; a path that does not exist is not an error (envd's). */
  remove(id: string, path: string, options?: FileOptions): Promise<void>;
  /**
   * Watches a directory for changes, whoever makes them: commands too, not only the file
   * verbs. Resolves once the watch sees changes. A change made by this executor's own file
   * verbs is reported before that verb resolves, as envd's inotify watch reports it (a new file
   * written is a create, a chmod for the hand-over to its user, and a write); changes made by
   * commands may come a moment later. `onChange` must not throw.
   */
  watch(id: string, request: WatchRequest, onChange: (change: FsChange) => void): Promise<DirWatch>;
  /** Freezes every process of the sandbox. */
  pause(id: string): Promise<void>;
  /**
   * Thaws a sandbox frozen by `pause`; a running sandbox is left as it is, so a wake calls it to
   * learn that the sandbox is still there (`gone` when it is not).
   */
  resume(id: string): Promise<void>;
  /** Resource use now. */
  stats(id: string): Promise<SandboxStats>;
  /**
   * Keeps the sandbox's file system as a snapshot on this node (Docker: `docker commit` to a
   * local image); the sandbox goes on as it was. Memory and processes are not captured.
   * `exists` when the team already has a snapshot by that name.
   */
  snapshot(id: string, request: SnapshotRequest): Promise<SnapshotInfo>;
  /** The snapshots this executor holds: one team's, or every team's when `team` is absent. */
  listSnapshots(team?: string): Promise<SnapshotInfo[]>;
  /**
   * Removes a snapshot this executor holds (of `team` only, when given); false when it holds
   * none by that id. Sandboxes started from it keep running.
   */
  deleteSnapshot(snapshotId: string, team?: string): Promise<boolean>;
  /**
   * A filesystem-only pause (E2B's `keepMemory: false`): keeps the sandbox's file system on this
   * node and removes the rest (Docker: commits the container to a local image, then removes the
   * container), so its processes end and it holds no memory and no CPU. The kept files are no
   * snapshot: `listSnapshots` does not name them. `list()` still names the sandbox; `restore`
   * starts it again, `destroy` removes what was kept. Any other call about it is `gone` until
   * restored.
   */
  archive(id: string): Promise<void>;
  /**
   * Starts an archived sandbox again under its own id (`request.id`) from the file system
   * `archive` kept, with `request`'s spec and environment as `create` takes them, then drops
   * what was kept. `gone` when nothing is kept for that id.
   */
  restore(request: CreateRequest): Promise<void>;
  /**
   * Ids of every sandbox this executor made and holds (for reconciliation at boot, which
   * removes those the ledger has no row for). Docker: the containers labelled with this
   * ledger's instance id, never another node's that happens to share the node id.
   */
  list(): Promise<string[]>;
  /**
   * Ids of sandboxes made before instance labels, which may be this node's or another's with
   * the same node id (Docker: containers labelled with the node id alone). The boot reconcile
   * adopts those its ledger knows and never removes the rest.
   */
  legacy?(): Promise<string[]>;
  /**
   * Replaces the egress address rules of a running sandbox (a sandbox with egress) at once:
   * never a moment with no rules or with both sets, and without restarting the sandbox or its
   * processes. A create applies `spec.egressRules` itself, before it resolves; destroy removes
   * them. Absent on an executor that cannot enforce them (its capabilities say so).
   *
   * @throws {ExecutorError} `invalid` for a sandbox without egress, `unavailable` when the
   * rules cannot be written (the old ones then stay). `team` is the sandbox's team (the egress
   * proxy shares its connections between teams).
   */
  setEgressRules?(id: string, rules: EgressRules, team?: string): Promise<void>;
  /** What it can serve now (templates, volumes); an executor without it serves any template. */
  capabilities?(): Promise<ExecutorCapabilities>;
  /**
   * Streams an image this executor holds, for a node that lacks it (a heal): `name` is a
   * snapshot id or an image the executor serves by name (a template's). Docker: `docker save`.
   * Absent on an executor that cannot move images between nodes.
   *
   * @throws {ExecutorError} `not_found` when it holds no such image.
   */
  exportImage?(name: string, signal: AbortSignal): Promise<ImageExport>;
  /**
   * Loads what another node's {@linkcode Executor.exportImage} streamed (Docker: `docker load`),
   * refuses it unless what arrived has `expected.digest`, and from then on holds it as its own
   * (a snapshot is listed by this executor, with its team, name and creation time as taken).
   * The caller bounds the bytes and the time (it errors `body` or aborts `signal`).
   *
   * @throws {ExecutorError} `invalid` when what arrived is not `name` with that digest.
   */
  importImage?(
    name: string,
    body: ReadableStream<Uint8Array>,
    expected: { digest: string },
    signal: AbortSignal,
  ): Promise<void>;
  /**
   * Pushes image `name` (as for `exportImage`) to the OCI registry `registry` (`host:port`,
   * plain HTTP on loopback). Absent on an executor without an engine that pushes.
   */
  pushImage?(name: string, registry: string, signal: AbortSignal): Promise<void>;
  /**
   * Pushes what `archive` kept of a sandbox to `registry`, with `record` (its ledger row as JSON)
   * beside it, so another node can resume it ({@linkcode Executor.pullArchive}).
   */
  pushArchive?(
    sandboxId: string,
    record: string,
    registry: string,
    signal: AbortSignal,
  ): Promise<void>;
  /**
   * Pulls another node's archive of a sandbox from `registry` and keeps it as its own (so
   * `restore` starts the sandbox); resolves to the record it was pushed with.
   *
   * @throws {ExecutorError} `not_found` when the registry has none.
   */
  pullArchive?(sandboxId: string, registry: string, signal: AbortSignal): Promise<string>;
  /**
   * Pulls image `name` from `registry` and holds it as its own, as `importImage` does.
   *
   * @throws {ExecutorError} `not_found` when the registry has no such image.
   */
  pullImage?(name: string, registry: string, signal: AbortSignal): Promise<void>;
  /**
   * Where the node reaches `port` inside the sandbox: an address on the node's own side (Docker:
   * the container's address on the node's internal network; fake: a loopback listener serving a
   * handler a test installed). `null` when the executor knows nothing listens there; a refused
   * connection to the address says the same for Docker.
   */
  portAddress(id: string, port: number): Promise<PortAddress | null>;
  /** Releases connections and timers. */
  close(): Promise<void>;
}
