/**
 * Structured logging: one JSON line per event on stderr.
 *
 * @module
 */

/** Log levels, quietest last. */
export type LogLevel = "debug" | "info" | "warn" | "error";

const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** The logging function every component takes: `log(level, msg, fields)`. */
export type Log = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => void;

/** Field names whose values never reach a log line. */
const secretField = /token|secret|signature|password|authorization|api[-_]?key/i;

/**
 * Removes secrets from fields: any field named like a token, and bearer-looking values.
 *
 * @example
 * ```ts
 * import { redact } from "./log.ts";
 * redact({ apiToken: "s3cret", nodeId: "a" }); // { apiToken: "[redacted]", nodeId: "a" }
 * ```
 */
export function redact(fields: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fields)) {
    if (secretField.test(k)) out[k] = "[redacted]";
    else if (typeof v === "string") {
      out[k] = v.replace(/(Bearer\s+)\S+/gi, "$1[redacted]").replace(
        /([?&](?:signature|token|access_token)=)[^&\s]+/gi,
        "$1[redacted]",
      );
    } else if (v instanceof Error) out[k] = v.message;
    else out[k] = v;
  }
  return out;
}

/**
 * Builds a logger writing one JSON line per event (`time`, `level`, `msg`, named fields) to
 * `write` (stderr by default), dropping events below `level`.
 *
 * @example
 * ```ts
 * import { createLog } from "@dormice/cluster/shared";
 * const log = createLog({ level: "info" });
 * log("info", "node checked in", { nodeId: "a" });
 * ```
 */
export function createLog(
  { level = "info", write = (line: string) => console.error(line), name }: {
    level?: LogLevel;
    write?: (line: string) => void;
    name?: string;
  } = {},
): Log {
  const floor = rank[level];
  return (lvl, msg, fields = {}) => {
    if (rank[lvl] < floor) return;
    write(JSON.stringify({
      time: new Date().toISOString(),
      level: lvl,
      ...(name ? { component: name } : {}),
      msg,
      ...redact(fields),
    }));
  };
}

/**
 * Parses `DORMICE_LOG_LEVEL`; returns an error sentence for a bad value.
 *
 * @example
 * ```ts
 * import { parseLogLevel } from "./log.ts";
 * parseLogLevel("warn"); // "warn"
 * ```
 */
export function parseLogLevel(value: string | undefined): LogLevel | Error {
  if (value === undefined || value === "") return "info";
  if (value in rank) return value as LogLevel;
  return new Error(
    `DORMICE_LOG_LEVEL='${value}' is not a level: write one of debug, info, warn, error`,
  );
}

/**
 * A logger that drops everything (the default in tests and embedded use when none is given).
 *
 * @example
 * ```ts
 * import { silentLog } from "@dormice/cluster/shared";
 * silentLog("info", "nobody hears this");
 * ```
 */
export const silentLog: Log = () => {};

/**
 * Logs a repeated condition only when it changes: `report(key, state, ...)` logs when `state`
 * differs from the last one seen for `key`, and stays quiet while it repeats.
 *
 * @example
 * ```ts
 * import { ChangeLog, createLog } from "./log.ts";
 * const changes = new ChangeLog(createLog());
 * changes.report("check-in", "ECONNREFUSED", "warn", "check-in failed", {});
 * changes.report("check-in", "ECONNREFUSED", "warn", "check-in failed", {}); // quiet
 * ```
 */
export class ChangeLog {
  #last = new Map<string, string>();
  #log: Log;
  /** Wraps `log`. */
  constructor(log: Log) {
    this.#log = log;
  }
  /** Logs when `state` for `key` changed since the last report; returns whether it logged. */
  report(
    key: string,
    state: string,
    level: LogLevel,
    msg: string,
    fields?: Record<string, unknown>,
  ): boolean {
    if (this.#last.get(key) === state) return false;
    this.#last.set(key, state);
    this.#log(level, msg, fields);
    return true;
  }
  /** Forgets `key` so the next report logs again. */
  clear(key: string): void {
    this.#last.delete(key);
  }
}
