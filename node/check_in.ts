/**
 * The check-in loop: a node tells its gateway every interval that it is alive and how loaded.
 *
 * @module
 */
import type { Log } from "../shared/log.ts";
import { ChangeLog, silentLog } from "../shared/log.ts";
import { describeFetchFailure } from "../shared/fetch_failure.ts";
import { HttpError } from "../shared/http_error.ts";
import { parseCheckInHeader } from "./config.ts";
import type { CheckIn, HostReading, NodeLifecycleEvent } from "../shared/schemas.ts";
import {
  idDigestKey,
  LookupDigest,
  type LookupDigestWire,
  nameDigestKey,
  NODE_DIGEST_FALSE_POSITIVE_RATE,
} from "../shared/lookup_digest.ts";

/** Options of {@linkcode CheckInLoop}. */
export interface CheckInOptions {
  /**
   * The gateway's URL (`DORMICE_GATEWAY_ENDPOINT`): its origin, or the path a host app mounts it
   * at; check-ins go to `<gatewayEndpoint>/checkIn`.
   */
  gatewayEndpoint: string;
  /**
   * Several gateways of one fleet (shared mode), tried in turn: the loop stays with the one that
   * answers and moves to the next when it does not (no answer, or a 5xx), within the same
   * attempt, so losing a gateway never makes the node look down. `gatewayEndpoint` alone when
   * absent or empty.
   */
  gatewayEndpoints?: readonly string[];
  /** This node's id (`DORMICE_NODE_ID`), the gateway's key for it. */
  nodeId: string;
  /** This node's origin as the gateway reaches it. */
  endpoint: string;
  /** Seconds between the end of one attempt and the next; also reported to the gateway. */
  intervalSeconds: number;
  /** The software build, e.g. `@dormice/cluster@0.1.0`. */
  build: string;
  /** The fleet token, sent as the bearer token of every check-in. */
  token: string;
  /** Takes a host reading for each check-in. */
  reading: () => HostReading;
  /**
   * One more header on every check-in, e.g. a host service's own auth in front of the gateway;
   * its value is never logged. Refused (`TypeError`) when its name is not a header name or is one
   * the check-in sets itself (`authorization`, `content-type`, `content-length`, `host`).
   */
  header?: { name: string; value: string } | null;
  /**
   * Sends the check-ins (the global `fetch` when absent); any `(request) => Response` handler
   * serves, e.g. a Hono app's `request`.
   */
  fetch?: (request: Request) => Response | Promise<Response>;
  /** Where failures and recoveries are logged; `silentLog` when absent. */
  log?: Log;
  /**
   * Bound of each attempt: 5 s, or the interval when shorter, so one slow gateway never stacks
   * attempts (the next one is scheduled only after this one ended).
   */
  timeoutMs?: number;
  /**
   * Lifecycle events to carry (the node's `LifecycleOutbox`): each check-in takes a batch, and
   * an accepted one marks it delivered; a failed one leaves it for the next.
   */
  events?: {
    batch(): NodeLifecycleEvent[];
    delivered(events: readonly NodeLifecycleEvent[]): void;
  };
  /**
   * The lookup digest of what the node holds now ({@linkcode lookupDigestOf}), built afresh for
   * each check-in; none is sent when absent (the gateway then asks this node on every miss).
   */
  lookupDigest?: () => LookupDigestWire;
  /** Hears how each attempt ended (the node's metrics count it); must not throw. */
  onOutcome?: (outcome: CheckInOutcome) => void;
  /**
   * What the node can serve, sent with every check-in (its pools, the templates whose images it
   * holds, its volumes, whether it enforces egress address rules, its config digest, the
   * snapshots it holds); nothing when absent. Must be quick and not throw.
   */
  capabilities?: () => Pick<
    CheckIn,
    | "pools"
    | "templates"
    | "volumes"
    | "egressRules"
    | "configDigest"
    | "snapshots"
    | "snapshotsTruncated"
    | "snapshotNames"
    | "snapshotRegistry"
    | "heals"
  >;
}

/**
 * The lookup digest of a node: every sandbox's name (within its team) and id, and every name
 * whose create is in flight (`busyNames`, team-scoped slots), since a create in flight must be
 * found and its ledger row only appears once the executor is done.
 *
 * @example
 * ```ts
 * import { lookupDigestOf } from "./check_in.ts";
 * const wire = lookupDigestOf([{ id: "sbx_1", name: "agent-1", team: "default" }], ["agent-2"]);
 * console.log(wire.count); // 3
 * ```
 */
export function lookupDigestOf(
  sandboxes: Iterable<{ id: string; name: string; team: string }>,
  busyNames: Iterable<string>,
): LookupDigestWire {
  const rows = [...sandboxes];
  const busy = [...busyNames];
  const digest = LookupDigest.sized(rows.length * 2 + busy.length, NODE_DIGEST_FALSE_POSITIVE_RATE);
  for (const s of rows) {
    digest.add(nameDigestKey(s.team, s.name));
    digest.add(idDigestKey(s.id));
  }
  // A busy slot is already team-scoped (`teamScopedName`).
  for (const slot of busy) digest.add(`n:${slot}`);
  // This node pushes creates made behind the gateway's back (Service's `announceDirect`).
  return { ...digest.toWire(), directPushed: true };
}

/**
 * Whether a check-in answer says the gateway skips nodes by digest (`lookupDigests` other than
 * `off`). The answer is small (`{ok, outcome, lookupDigests}`); read at most 64 KiB of it.
 */
async function skipsByDigest(response: Response): Promise<boolean> {
  try {
    const text = await response.text();
    if (text.length > 65_536) return false;
    const mode = JSON.parse(text)?.lookupDigests;
    return typeof mode === "string" && mode !== "off";
  } catch {
    return false;
  }
}

/** What a check-in pushed out of turn was pushed for (none for the interval's own). */
export type PushedFor = Pick<CheckIn, "directCreate" | "snapshotRetaken">;

/** How one attempt ended. */
export type CheckInOutcome =
  | { ok: true; status: number }
  | { ok: false; cause: string };

const cut = (text: string, n = 400): string => text.length > n ? text.slice(0, n) + "…" : text;

/**
 * What makes two failures the same failure: the cause with its numbers blanked, so a gateway
 * sentence that counts ("last check-in 3 s ago", then 4 s) is logged once, not every tick. The
 * gateway's status stays: a 409 turning into a 502 is news.
 */
function sameFailureKey(cause: string): string {
  const blank = (text: string) => text.replace(/\d+/g, "#");
  const answered = /^(the gateway answered \d+: )([\s\S]*)$/.exec(cause);
  return answered ? answered[1] + blank(answered[2]) : blank(cause);
}

/** Whether another gateway may answer where this one failed: it did not answer, or a 5xx. */
function movesOn(outcome: CheckInOutcome): boolean {
  if (outcome.ok || outcome.cause === "stopped") return false;
  const status = /^the gateway answered (\d+)/.exec(outcome.cause);
  return status === null || Number(status[1]) >= 500;
}

export { describeFetchFailure };

/**
 * Posts `{nodeId, endpoint, intervalSeconds, build, reading}` to `<gateway>/checkIn` every
 * interval with the fleet token. Never follows a redirect (a 3xx is logged with its Location and
 * the variable to fix), logs a failure when the failure changes rather than every tick (with its
 * numbers blanked: a cause that counts seconds is one failure), logs a recovery once, and is
 * never fatal.
 *
 * @example
 * ```ts ignore
 * import { CheckInLoop } from "@dormice/cluster/node";
 * const loop = new CheckInLoop({ gatewayEndpoint: "http://10.0.0.1:3677", nodeId: "node-a",
 *   endpoint: "http://10.0.0.5:3676", intervalSeconds: 15, build: "dev", token,
 *   reading: () => reader.read() });
 * loop.start();
 * await loop.stop();
 * ```
 */
export class CheckInLoop {
  #options: CheckInOptions;
  #fetch: (request: Request) => Response | Promise<Response>;
  #log: Log;
  #changes: ChangeLog;
  #timeoutMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #inFlight: Promise<CheckInOutcome> | null = null;
  #abort: AbortController | null = null;
  #running = false;
  #failing = false;
  #tick: (() => Promise<void>) | undefined;
  #nudged = false;
  #gatewaySkips = false;
  #nudgeTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #gateways: readonly string[];
  /** The gateway checked in with now: kept while it answers. */
  #current = 0;

  /** Builds the loop; nothing is sent until `start()` or `once()`. */
  constructor(options: CheckInOptions) {
    if (options.header) {
      const r = parseCheckInHeader(`${options.header.name}: ${options.header.value}`);
      // The sentence never repeats the value: it is a secret.
      if (!r.ok) throw new TypeError(`Cannot create the check-in loop: header: ${r.error}`);
    }
    this.#options = options;
    this.#gateways = options.gatewayEndpoints?.length
      ? options.gatewayEndpoints
      : [options.gatewayEndpoint];
    this.#fetch = options.fetch ?? fetch;
    this.#log = options.log ?? silentLog;
    this.#changes = new ChangeLog(this.#log);
    this.#timeoutMs = options.timeoutMs ?? Math.min(5000, options.intervalSeconds * 1000);
  }

  /** The check-in URL of the gateway checked in with now. */
  get url(): string {
    return `${this.#gateways[this.#current]}/checkIn`;
  }

  /**
   * Checks in once now; never rejects. Attempts never overlap: one asked for while another is
   * in flight starts when it ends, so the gateway hears check-ins in the order they were built
   * (the lookup digest argument counts on it, docs/lookup-digest.md).
   */
  once(pushedFor?: PushedFor): Promise<CheckInOutcome> {
    const previous = this.#inFlight ?? Promise.resolve();
    const attempt = previous.then(() => this.#attempt(pushedFor)).then((outcome) => {
      this.#report(outcome);
      if (outcome.ok || outcome.cause !== "stopped") this.#options.onOutcome?.(outcome);
      return outcome;
    });
    this.#inFlight = attempt;
    return attempt;
  }

  /** Checks in at once, then every interval (the next attempt is timed from the end of the last). */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    const tick = async () => {
      this.#nudged = false;
      await this.once();
      if (this.#running) {
        // A nudge during the attempt is served at once, not an interval later.
        this.#timer = setTimeout(tick, this.#nudged ? 0 : this.#options.intervalSeconds * 1000);
      }
    };
    this.#tick = tick;
    void tick();
  }

  /**
   * Checks in soon rather than at the next interval: something happened the gateway should hear
   * of (the deadline scanner killed a sandbox). Nudges within `delayMs` make one check-in, and a
   * nudge during an attempt makes the next one start when it ends.
   */
  nudge(delayMs = 200): void {
    if (!this.#running || this.#tick === undefined || this.#nudged) return;
    this.#nudged = true;
    clearTimeout(this.#nudgeTimer);
    this.#nudgeTimer = setTimeout(() => {
      // An attempt in flight reschedules itself at once when it ends (see start()).
      if (!this.#running || this.#abort !== null) return;
      clearTimeout(this.#timer);
      void this.#tick!();
    }, delayMs);
  }

  /**
   * Whether the gateway last heard from skips nodes by their lookup digest (its check-in answer's
   * `lookupDigests` is not `off`): then a create made behind its back must reach it before the
   * node builds (`pushDirectCreate`).
   */
  get gatewaySkips(): boolean {
    return this.#gatewaySkips;
  }

  /**
   * A check-in built now, for a create made behind the gateway's back (no `x-dormice-hop`
   * header): the gateway hears of the name's busy slot (before the build) or the new row (after
   * it) at once instead of an interval later. Rejects with a 503 when the check-in did not reach
   * a gateway that skips nodes by digest: that gateway could not find the name, so the node must
   * not build it.
   */
  async pushDirectCreate(
    what: string,
    created?: { team: string; name: string; id?: string },
  ): Promise<void> {
    const outcome = await this.once(created === undefined ? undefined : { directCreate: created });
    if (outcome.ok || !this.#gatewaySkips) return;
    throw new HttpError(
      503,
      `Cannot create ${what} directly on this node now: the gateway (${this.url}) must hear of ` +
        `a create made behind its back before the node builds it, so that it can find the name, ` +
        `and the check-in failed (${outcome.cause}). Create it through the gateway, or retry ` +
        "once the gateway answers check-ins again",
      { headers: { "retry-after": String(Math.max(1, this.#options.intervalSeconds)) } },
    );
  }

  /**
   * A check-in built now, for a snapshot just taken (new, or under an id another node may hold
   * an older build of: a name taken again): the gateway applies it, and in shared mode records
   * it in etcd, before it answers, so a create, delete or lookup that follows the take's answer,
   * through any gateway, finds it (the gateways ask only advertising nodes) and a create from
   * the id is placed on the newest build. Never rejects: the build is made, so a failed
   * check-in is logged and the gateways learn of it at the next one.
   */
  async pushRetaken(snapshotId: string): Promise<CheckInOutcome> {
    const outcome = await this.once({ snapshotRetaken: snapshotId });
    if (!outcome.ok && outcome.cause !== "stopped") {
      this.#log("warn", "a snapshot taken was not pushed to the gateway", {
        snapshot: snapshotId,
        cause: outcome.cause,
        effect: "until this node's next check-in, gateways may not find it, and a create " +
          "from that id may start from an older build another node holds",
        nodeId: this.#options.nodeId,
      });
    }
    return outcome;
  }

  /** Stops the loop and aborts an attempt in flight. */
  async stop(): Promise<void> {
    this.#running = false;
    clearTimeout(this.#timer);
    clearTimeout(this.#nudgeTimer);
    this.#abort?.abort();
    await this.#inFlight;
    clearTimeout(this.#timer);
  }

  /** The body of the next check-in. */
  body(): CheckIn {
    const o = this.#options;
    const events = o.events?.batch() ?? [];
    return {
      nodeId: o.nodeId,
      endpoint: o.endpoint,
      intervalSeconds: o.intervalSeconds,
      build: o.build,
      reading: o.reading(),
      ...(events.length > 0 ? { events } : {}),
      ...o.capabilities?.(),
      ...(o.lookupDigest ? { lookupDigest: o.lookupDigest() } : {}),
    };
  }

  async #attempt(pushedFor?: PushedFor): Promise<CheckInOutcome> {
    try {
      const body = pushedFor ? { ...this.body(), ...pushedFor } : this.body();
      let outcome = await this.#send(body);
      // Each other gateway once: a 4xx is the fleet's verdict, the same from all of them.
      for (let tried = 1; tried < this.#gateways.length && movesOn(outcome); tried++) {
        const from = this.#gateways[this.#current];
        this.#current = (this.#current + 1) % this.#gateways.length;
        this.#log("warn", "check-in moves to the next gateway", {
          from,
          to: this.#gateways[this.#current],
          cause: outcome.ok ? "" : outcome.cause,
          nodeId: this.#options.nodeId,
        });
        outcome = await this.#send(body);
      }
      return outcome;
    } finally {
      this.#abort = null;
    }
  }

  async #send(body: CheckIn): Promise<CheckInOutcome> {
    const abort = new AbortController();
    this.#abort = abort;
    let response: Response;
    try {
      const headers = new Headers();
      const extra = this.#options.header;
      if (extra) headers.set(extra.name, extra.value);
      headers.set("content-type", "application/json");
      headers.set("authorization", `Bearer ${this.#options.token}`);
      response = await this.#fetch(
        new Request(this.url, {
          method: "POST",
          headers,
          body: JSON.stringify(body),
          redirect: "manual",
          signal: AbortSignal.any([abort.signal, AbortSignal.timeout(this.#timeoutMs)]),
        }),
      );
    } catch (error) {
      if (abort.signal.aborted) return { ok: false, cause: "stopped" };
      return { ok: false, cause: describeFetchFailure(error, this.#timeoutMs) };
    }
    const status = response.status;
    if (status >= 200 && status < 300) {
      this.#gatewaySkips = await skipsByDigest(response);
      if (body.events) this.#options.events?.delivered(body.events);
      return { ok: true, status };
    }
    if (status >= 300 && status < 400) {
      await response.body?.cancel();
      const location = response.headers.get("location") ?? "(no Location header)";
      return {
        ok: false,
        cause:
          `the gateway answered ${status} redirecting to ${location}; check-ins never follow ` +
          "redirects: set DORMICE_GATEWAY_ENDPOINT to the gateway's own URL",
      };
    }
    let text = "";
    try {
      text = await response.text();
    } catch { /* the body broke off: the status still says enough */ }
    let message = text;
    try {
      const parsed = JSON.parse(text);
      if (typeof parsed?.message === "string") message = parsed.message;
    } catch { /* not JSON: keep the text */ }
    return {
      ok: false,
      cause: `the gateway answered ${status}: ${cut(message.trim() || response.statusText)}`,
    };
  }

  #report(outcome: CheckInOutcome): void {
    const fields = { gateway: this.#gateways[this.#current], nodeId: this.#options.nodeId };
    if (outcome.ok) {
      const recovered = this.#failing;
      this.#failing = false;
      this.#changes.report(
        "check-in",
        "ok",
        "info",
        recovered ? "check-in recovered" : "checked in with the gateway",
        fields,
      );
      return;
    }
    if (outcome.cause === "stopped") return;
    this.#failing = true;
    this.#changes.report("check-in", sameFailureKey(outcome.cause), "warn", "check-in failed", {
      ...fields,
      cause: outcome.cause,
      fix: "check that the gateway runs and that DORMICE_GATEWAY_ENDPOINT names it",
    });
  }
}
