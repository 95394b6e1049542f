/**
 * The node's last answer from the executor about what it can serve (templates and volumes),
 * asked in the background so a slow engine never delays a check-in.
 *
 * @module
 */
import type { Log } from "../shared/log.ts";
import type { ExecutorCapabilities } from "./executors/contract.ts";

/**
 * Asks the executor for its capabilities, one question at a time, and keeps the last answer.
 * A failure is logged when it starts or its cause changes, and the recovery once: the question
 * is asked at every check-in, so an engine outage would otherwise log one warning per interval
 * for as long as it lasts.
 *
 * @example
 * ```ts
 * import { CapabilitiesReader } from "./capabilities_reader.ts";
 * const reader = new CapabilitiesReader(() => Promise.resolve({ templates: [], volumes: [] }));
 * await reader.refresh();
 * console.log(reader.current); // { templates: [], volumes: [] }
 * ```
 */
export class CapabilitiesReader {
  #ask: (() => Promise<ExecutorCapabilities>) | undefined;
  #log: Log;
  #asking = false;
  /** The last failure's message (capped), or undefined while the last question was answered. */
  #failing: string | undefined;
  /** The executor's last answer, or null before the first. */
  current: ExecutorCapabilities | null = null;

  /** `ask` undefined: the executor says nothing about its capabilities, and nothing is asked. */
  constructor(ask: (() => Promise<ExecutorCapabilities>) | undefined, log: Log = () => {}) {
    this.#ask = ask;
    this.#log = log;
  }

  /** Asks once unless a question is already out; resolves when it is answered or failed. */
  refresh(): Promise<void> {
    if (this.#asking || this.#ask === undefined) return Promise.resolve();
    this.#asking = true;
    let asked: Promise<ExecutorCapabilities>;
    try {
      asked = this.#ask();
    } catch (error) {
      asked = Promise.reject(error);
    }
    return asked.then(
      (c) => {
        this.current = c;
        if (this.#failing !== undefined) {
          this.#log("info", "the executor's templates and volumes can be read again");
        }
        this.#failing = undefined;
      },
      (error) => {
        const message = String(error instanceof Error ? error.message : error).slice(0, 500);
        if (message !== this.#failing) {
          this.#log(
            "warn",
            "could not read the executor's templates and volumes: check-ins send the last " +
              "answer until it can (logged again only when the cause changes or it recovers)",
            { error: message },
          );
        }
        this.#failing = message;
      },
    ).finally(() => this.#asking = false);
  }
}
