/**
 * Health probes of nodes the gateway cannot hear of. In shared mode a node checking in with
 * another gateway is known here only through etcd; while etcd cannot be read, such a node is
 * "unheard" (`Fleet.isUnheard`): it may be fine, or it may have died during the outage. Its
 * requests are still routed, and a probe of its `/healthz` tells the two apart, so a client
 * waits a probe's bound for a dead node, not the head timeout.
 *
 * @module
 */
import type { FleetNode } from "../fleet/node.ts";
import { describeFetchFailure } from "../../shared/fetch_failure.ts";

/** Options of {@linkcode NodeProbes}. */
export interface NodeProbesOptions {
  /** The HTTP client to the nodes. */
  fetch?: typeof fetch;
  /** The gateway's clock reading, ms since the epoch (the Fleet's `now`). */
  now: () => number;
  /**
   * Bound of one probe. Default 2000 ms, a lookup round's: a node that answers nothing in that
   * time is not serving its sandboxes either.
   */
  timeoutMs?: number;
  /**
   * How long a probe's verdict stands before the next request asks again. Default 5000 ms: a
   * node that came back is served within that, and a dead one costs one probe per period.
   */
  freshMs?: number;
  /** Most nodes remembered; the oldest is let go past it. Default 10,000. */
  maxNodes?: number;
  /** Makes a probe's bound: `AbortSignal.timeout` by default (a test passes its own). */
  timeout?: (ms: number) => AbortSignal;
}

interface Probe {
  endpoint: string;
  /** When the last probe was started. */
  at: number;
  asking: boolean;
  /** Why the last finished probe failed, or `undefined` when it was answered (or none ended). */
  failure: string | undefined;
}

/**
 * Per node, the last `/healthz` probe's verdict. `failure(node)` is cheap (a map hit) and starts
 * a probe when none is fresh, so it can be asked at every request and every tick of a waiting
 * forward.
 *
 * @example
 * ```ts ignore
 * const probes = new NodeProbes({ now: () => fleet.now() });
 * const cause = probes.failure(node); // undefined until a probe failed
 * ```
 */
export class NodeProbes {
  readonly #fetch: typeof fetch;
  readonly #now: () => number;
  readonly #timeoutMs: number;
  readonly #freshMs: number;
  readonly #max: number;
  readonly #timeout: (ms: number) => AbortSignal;
  readonly #probes = new Map<string, Probe>();

  /** Builds the probes; nothing is asked until `failure()`. */
  constructor(options: NodeProbesOptions) {
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#now = options.now;
    this.#timeoutMs = options.timeoutMs ?? 2000;
    this.#freshMs = options.freshMs ?? 5000;
    this.#max = options.maxNodes ?? 10_000;
    this.#timeout = options.timeout ?? ((ms) => AbortSignal.timeout(ms));
  }

  /** How many nodes have a probe on record. */
  get size(): number {
    return this.#probes.size;
  }

  /**
   * Why `node`'s last probe failed, or `undefined` (answered, or no probe has ended yet). Starts
   * a probe when the last one is older than `freshMs` and none is out.
   */
  failure(node: FleetNode): string | undefined {
    const now = this.#now();
    let probe = this.#probes.get(node.id);
    if (probe !== undefined && probe.endpoint !== node.endpoint) {
      this.#probes.delete(node.id);
      probe = undefined;
    }
    if (probe === undefined) {
      if (this.#probes.size >= this.#max) {
        this.#probes.delete(this.#probes.keys().next().value!);
      }
      probe = { endpoint: node.endpoint, at: now, asking: false, failure: undefined };
      this.#probes.set(node.id, probe);
      this.#ask(probe);
    } else if (!probe.asking && now - probe.at > this.#freshMs) {
      probe.at = now;
      this.#ask(probe);
    }
    return probe.failure;
  }

  /** Lets go of a node (removed from the fleet, or heard again). */
  forget(nodeId: string): void {
    this.#probes.delete(nodeId);
  }

  #ask(probe: Probe): void {
    probe.asking = true;
    const signal = this.#timeout(this.#timeoutMs);
    void this.#fetch(`${probe.endpoint}/healthz`, { signal }).then(
      async (res) => {
        // Any answer means the process serves: its sandboxes' requests will be answered.
        await res.body?.cancel();
        probe.failure = undefined;
      },
      (error) => {
        probe.failure = signal.aborted
          ? `no answer to a health check within ${this.#timeoutMs} ms`
          : describeFetchFailure(error);
      },
    ).finally(() => probe.asking = false);
  }
}
