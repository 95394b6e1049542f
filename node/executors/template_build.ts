/**
 * What an executor is told when it builds a template (E2B's `Template()` builder): the steps as
 * the SDK sends them, and what it reports back while it works. The result is a snapshot of the
 * building team, named after the template and kept under the template's id, so everything a
 * snapshot has (check-in advertising, creates by name within the team, fleet-wide delete, the
 * movement of images between nodes) serves built templates too.
 *
 * @module
 */
import type { SnapshotInfo } from "./contract.ts";

/** One step of a build, as the SDK serializes it (`TemplateStep` in E2B's API). */
export interface TemplateStep {
  /** `RUN`, `COPY`, `ENV`, `WORKDIR` or `USER`. */
  type: string;
  /**
   * `RUN`: command, then user (optional). `COPY`: source, destination, user, octal mode
   * (`""` when not given). `ENV`: name, value, name, value… `WORKDIR`: path. `USER`: name.
   */
  args: string[];
  /** `COPY`: the hash of the uploaded context archive. */
  filesHash?: string;
  /** Run this step (and every one after it) even when its result is cached. */
  force?: boolean;
}

/** A build as the node hands it to its executor. */
export interface TemplateBuildSpec {
  /** The template's id: a snapshot id, which the result is kept under. */
  templateId: string;
  /** This build's id (a UUID). */
  buildId: string;
  /** The team that builds it and owns the result. */
  team: string;
  /** The template's name (its alias) within the team. */
  name: string;
  /** A template of the node (`DORMICE_TEMPLATES`) the build starts from. */
  fromTemplate?: string;
  /** A snapshot (of the building team) the build starts from, when `fromTemplate` named one. */
  fromSnapshot?: string;
  /** What `fromTemplate` said when it named that snapshot (its name or id), for messages. */
  fromSnapshotName?: string;
  /** An image reference the build starts from (pulled when the engine lacks it). */
  fromImage?: string;
  /** The steps, in order. */
  steps: TemplateStep[];
  /** Started in every sandbox of the template before it is handed out. */
  startCmd?: string;
  /** Run until it succeeds after `startCmd`; the sandbox is handed out once it does. */
  readyCmd?: string;
  /** Run every step, whatever is cached. */
  force: boolean;
  /** CPUs a build step may use (the SDK's `cpuCount`); the engine's default when absent. */
  cpus?: number;
  /** Memory a build step may use, MB (the SDK's `memoryMB`); the engine's default when absent. */
  memoryMB?: number;
}

/** A log line of a build. */
export interface BuildLogLine {
  /** When, ms since the epoch. */
  at: number;
  /** Its level. */
  level: "debug" | "info" | "warn" | "error";
  /** The text. */
  message: string;
  /** The step it is about: `base`, the step's number from 1, or `finalize`. */
  step?: string;
}

/** What a building executor reports to and reads from. */
export interface BuildIo {
  /** Records a log line of the build. */
  log(level: BuildLogLine["level"], message: string, step?: string): void;
  /** The path of the uploaded context archive (a gzipped tar) of `hash`, or undefined. */
  contextFile(hash: string): string | undefined;
  /** Aborted when the build runs past its bound or the node stops. */
  signal: AbortSignal;
}

/**
 * A build that failed at a step: its message names the step, and the step's last log lines
 * travel with it to the SDK's `BuildError`.
 */
export class TemplateBuildError extends Error {
  /** `base`, the step's number from 1, or `finalize`. */
  readonly step: string;
  /** The last lines the step printed. */
  readonly tail: string[];

  /** A failure of `step`, saying `message`, with the step's last output lines. */
  constructor(step: string, message: string, tail: string[] = []) {
    super(message);
    this.name = "TemplateBuildError";
    this.step = step;
    this.tail = tail;
  }
}

/** An executor that builds templates. */
export interface TemplateBuilder {
  /**
   * Runs the build's steps and keeps the result as the snapshot `spec.templateId` of
   * `spec.team`, named `spec.name` (replacing one by that id).
   *
   * @throws {TemplateBuildError} naming the failing step.
   */
  buildTemplate(spec: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo>;
  /**
   * Publishes a built template of `team` (every team may then find it and start from it) or
   * makes it the team's own again; false when this executor holds no template of `team` by that
   * id.
   */
  setTemplatePublic(templateId: string, team: string, published: boolean): Promise<boolean>;
}

/** Whether `executor` builds templates. */
export function isTemplateBuilder(executor: unknown): executor is TemplateBuilder {
  return typeof (executor as Partial<TemplateBuilder> | null)?.buildTemplate === "function";
}

/** The step name E2B's SDK reads for the step at `index` (0-based) of `steps`. */
export function stepName(index: number): string {
  return String(index + 1);
}

/** `text` quoted for `/bin/sh`. */
export function shellQuote(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

/**
 * The command a sandbox of a built template runs once started (the image's `dormice.start`):
 * the start command in the background, then the ready command until it succeeds (the node's
 * create deadline bounds the wait).
 */
export function startScript(startCmd: string | undefined, readyCmd: string | undefined): string {
  const parts: string[] = [];
  if (startCmd?.trim()) {
    parts.push(
      `nohup /bin/sh -c ${shellQuote(startCmd)} >/tmp/.dormice-start.log 2>&1 </dev/null &`,
    );
  }
  if (readyCmd?.trim()) {
    parts.push(`until /bin/sh -c ${shellQuote(readyCmd)} >/dev/null 2>&1; do sleep 0.2; done`);
  }
  // One line: the label's value keeps no newline. `&` ends the first command already.
  return parts.join(" ");
}

/** How long a line {@linkcode readLines} holds before it hands it on unfinished. */
export const MAX_LINE_CHARS = 8192;

/**
 * Calls `emit` with each line of `stream` (UTF-8), holding at most
 * {@linkcode MAX_LINE_CHARS} of an unfinished one: a step printing without newlines is handed
 * on in pieces, never gathered whole in memory.
 */
export async function readLines(
  stream: ReadableStream<Uint8Array>,
  emit: (line: string) => void,
): Promise<void> {
  let rest = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + chunk).split("\n");
    rest = lines.pop() ?? "";
    for (const line of lines) emit(line);
    while (rest.length > MAX_LINE_CHARS) {
      emit(rest.slice(0, MAX_LINE_CHARS));
      rest = rest.slice(MAX_LINE_CHARS);
    }
  }
  if (rest) emit(rest);
}
