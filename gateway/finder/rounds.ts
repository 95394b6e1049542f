/**
 * Concurrent lookups of one key share one round: the first caller starts it, later ones join,
 * and a caller that leaves (its signal aborts) stops waiting without stopping the others. When
 * every caller that could leave has left, the round is aborted (so the nodes stop working for
 * nobody) and forgotten (so the next caller starts afresh). Kept apart from `finder.ts` because
 * this bookkeeping is independent of what a round asks and how its answers are judged.
 *
 * A `none` answers only the callers there when the round began. One that joined later asks once
 * more, in a round started after it came (shared with the other late ones): the name may have
 * been made in between (through another gateway), and a routed verb on a name that exists must
 * not be told it does not.
 *
 * @module
 */
import { EveryCallerLeft } from "./lookup_client.ts";
import type { FindBy, FindResult } from "./outcomes.ts";

interface Round {
  promise: Promise<FindResult>;
  /** Callers waiting that may still leave; when the last one leaves, the round is aborted. */
  leavers: number;
  /** Callers that can never leave (no signal): the round is never abandoned for them. */
  pinned: boolean;
  controller: AbortController;
  /** Its place in the order rounds began: a caller that came after it began asks again on none. */
  seq: number;
}

/**
 * The rounds in flight, one per key and kind of key.
 *
 * @example
 * ```ts ignore
 * const rounds = new SharedRounds();
 * const r = await rounds.join("name", "agent-1", { signal }, (controller) => ask(controller));
 * ```
 */
export class SharedRounds {
  readonly #byName = new Map<string, Round>();
  readonly #byId = new Map<string, Round>();
  /** Rounds begun so far. */
  #begun = 0;

  /**
   * Joins the round in flight for `key`, or starts one with `start` (always, with `fresh`).
   * Without a signal the caller can never leave, so the round is never abandoned for it. A
   * caller that joined a round in flight and got `none` joins one started after it came, or
   * starts it, once.
   *
   * @example
   * ```ts ignore
   * return rounds.join(by, key, options, (controller) => this.#round(by, key, controller));
   * ```
   */
  join(
    by: FindBy,
    key: string,
    options: { signal?: AbortSignal; fresh?: boolean },
    start: (controller: AbortController) => Promise<FindResult>,
  ): Promise<FindResult> {
    const { signal } = options;
    const rounds = by === "name" ? this.#byName : this.#byId;
    const came = this.#begun;
    const inFlight = options.fresh ? undefined : rounds.get(key);
    if (inFlight === undefined) {
      return this.#wait(this.#begin(rounds, key, start), rounds, key, signal);
    }
    return this.#wait(inFlight, rounds, key, signal).then((result) => {
      if (result.kind !== "none") return result;
      if (signal?.aborted) throw signal.reason;
      const later = rounds.get(key);
      const round = later !== undefined && later.seq > came
        ? later
        : this.#begin(rounds, key, start);
      return this.#wait(round, rounds, key, signal);
    });
  }

  #begin(
    rounds: Map<string, Round>,
    key: string,
    start: (controller: AbortController) => Promise<FindResult>,
  ): Round {
    const controller = new AbortController();
    const started = start(controller);
    const created: Round = {
      promise: started,
      leavers: 0,
      pinned: false,
      controller,
      seq: ++this.#begun,
    };
    rounds.set(key, created);
    started.finally(() => {
      if (rounds.get(key) === created) rounds.delete(key);
    }).catch(() => {});
    return created;
  }

  #wait(
    round: Round,
    rounds: Map<string, Round>,
    key: string,
    signal: AbortSignal | undefined,
  ): Promise<FindResult> {
    if (signal === undefined) {
      round.pinned = true;
      return round.promise;
    }
    return waitFor(round, signal, () => {
      if (rounds.get(key) === round) rounds.delete(key);
    });
  }
}

function waitFor(round: Round, signal: AbortSignal, forget: () => void): Promise<FindResult> {
  round.leavers++;
  return new Promise<FindResult>((resolve, reject) => {
    let done = false;
    const onAbort = () => {
      if (done) return;
      done = true;
      round.leavers--;
      if (round.leavers === 0 && !round.pinned) {
        // Nobody wants this answer any more: stop the nodes' work, and let the next caller
        // start a fresh round instead of joining an aborted one.
        forget();
        round.controller.abort(new EveryCallerLeft());
      }
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    round.promise.then((result) => {
      if (done) return;
      done = true;
      signal.removeEventListener("abort", onAbort);
      resolve(result);
    }, (error) => {
      if (done) return;
      done = true;
      signal.removeEventListener("abort", onAbort);
      reject(error);
    });
  });
}
