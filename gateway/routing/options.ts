/**
 * What a `GatewayRouting` (routing.ts) is built from and told: its options, its observer, and the
 * options and answers of its verbs.
 *
 * @module
 */
import type { Fleet, FleetNode } from "../fleet/fleet.ts";
import type { FindBy, Finder, FindOne, FoundSandbox } from "../finder/finder.ts";
import type { PickResult, Placer } from "../placer/placer.ts";
import type { Slots } from "./slots.ts";
import type { CapturedAnswer } from "./create.ts";
import type { Log } from "../../shared/log.ts";
import type { Clock, Timers } from "../../shared/clock.ts";

/** Options for `GatewayRouting` (routing.ts). */
export interface GatewayRoutingOptions {
  /** The nodes `fanOut` asks; an answer is cached only while its node is still registered. */
  fleet: Fleet;
  /** Where a request's sandbox lives; creates and destroys keep its cache current. */
  finder: Finder;
  /** Chooses the node for a create, and hears of refused creates and of destroys. */
  placer: Placer;
  /** The fleet token: the node's credentials the gateway forwards with. */
  token: string;
  /** The HTTP client to the nodes; the global `fetch` by default (it pools connections). */
  fetch?: typeof fetch;
  /** Where placements and failures go; silent by default. */
  log?: Log;
  /**
   * Bound of each node's answer when every node is asked (`listSandboxes`). Default 5000 ms: a
   * listing is heavier than a lookup, and a silent node is named in the answer, not waited for.
   */
  fanOutTimeoutMs?: number;
  /**
   * The least nodes a fleet-wide call asks at once (`fanOut`: listings, metrics, `setPools`), and
   * its width before any answer was timed. Default 128,
   * like a lookup round's (`DORMICE_GATEWAY_LOOKUP_CONCURRENCY`): 10,000 nodes asked together
   * open 10,000 connections, and most are not heard within the bound.
   */
  fanOutConcurrency?: number;
  /**
   * The most nodes a fleet-wide call asks at once when the width rule widens it (recent answers
   * slow, or this call's first ones): default 1,024 or `fanOutConcurrency` if more, the lookup
   * rounds' ceiling (`gateway/finder/round_width.ts`).
   */
  fanOutConcurrencyMax?: number;
  /** Time source of the fleet-wide calls' latencies; `performance.now()` by default. */
  clock?: Clock;
  /**
   * Bound of a node's create or destroy. Default 120,000 ms: a Docker create takes well under a
   * second, and a node that hangs longer must not hold the name's slot for ever.
   */
  captureTimeoutMs?: number;
  /**
   * The per-name slots: in memory by default ({@linkcode LocalSlots}), shared through etcd when
   * several gateways front one fleet (`EtcdSlots`).
   */
  slots?: Slots;
  /**
   * Shared mode: writes the record of a created sandbox's id (naming its node) where every
   * gateway's lookup by id reads it, before the client hears of the id; none by default.
   */
  publishId?: (id: string, nodeId: string) => Promise<void>;
  /** Hears of every sandbox destroyed through the gateway (the team limits count it back). */
  onDestroyed?: (found: FindOne, answer: CapturedAnswer) => void;
  /** Hears of placements, forwards and creates (metrics, the fleet page, lifecycle events). */
  observer?: RoutingObserver;
  /**
   * This gateway's id in the hop marker every node request carries (see `gateway/door.ts`); a fresh
   * random id by default, `createGateway` passes the one its door checks.
   */
  hopMarker?: string;
  /**
   * The longest wait for a streamed node request's head once its body is sent
   * (`DORMICE_GATEWAY_HEAD_TIMEOUT_MS`). Default 120,000 ms, like a create's: the native verbs
   * answer when their work is done (an `execCommand` asks for longer with `timeoutSeconds`),
   * envd streams its head at once, and a node that takes longer is stuck. A node that stops
   * checking in ends its pending waits sooner, as soon as the Fleet reads it silent.
   */
  headTimeoutMs?: number;
  /**
   * The clock and timers of the watch over streamed requests waiting for their head
   * (`hangUps`): `performance.now()` and the runtime's timers by default; a test's `FakeClock`.
   */
  hangUpClock?: Clock & Timers;
}

/**
 * What the routing rules report as they work. Every method runs inline, on the request path,
 * and must return at once without throwing (queue anything slow).
 */
export interface RoutingObserver {
  /** A placement was decided for `key` (placed, or nothing fits). */
  placed?(key: string, pick: PickResult): void;
  /**
   * A forward to a node ended: `status` is the node's (502 when it did not answer), `seconds`
   * the time to its answer's head, `found` where the sandbox was when it was streamed.
   */
  forwarded?(path: string, status: number, seconds: number, found?: FindOne): void;
  /** A create placed on `node` answered 2xx with `sandbox` (never a wake of an existing one). */
  created?(node: FleetNode, sandbox: FoundSandbox, path: string): void;
  /** A destroy through the gateway answered 2xx. */
  destroyed?(found: FindOne, path: string): void;
}

/** Options of `GatewayRouting.stream`. */
export interface StreamOptions {
  /** Where the sandbox lives: the Finder's cached entry, or what `locate` / `resolve` found. */
  found: FindOne;
  /** Whether `key` is a name or an id: a node's 404 re-checks the cache entry under it. */
  by: FindBy;
  /** The name or id the request was routed by. */
  key: string;
  /** The path and query on the node, e.g. `/execCommand` or `/e2b/envd/files?path=/a`. */
  path: string;
  /** A body already read to route on; the client's own body streams through when absent. */
  body?: BodyInit | null;
  /**
   * The bound on the node's head for this request, replacing the routing's `headTimeoutMs`:
   * `execCommand` asks for its command's own timeout plus a margin.
   */
  headTimeoutMs?: number;
  /**
   * Headers to set or replace on the node's request; the fleet token and JSON content type
   * (`GatewayRouting.nodeHeaders`) by default. `{}` passes the client's headers through
   * untouched (envd, whose access token the node checks).
   */
  headers?: Readonly<Record<string, string>>;
}

/** Options of `GatewayRouting.destroy`. */
export interface DestroyOptions {
  /** Whether `key` is a name or an id. */
  by: FindBy;
  /** The name or id. */
  key: string;
  /** The path on the node, e.g. `/destroySandbox`. */
  path: string;
  /** The body to send. */
  body: string;
  /** The HTTP method (POST by default; E2B kill is DELETE). */
  method?: string;
  /** The client's signal: a client that left before the slot or the lookup destroys nothing. */
  signal: AbortSignal;
  /** Headers for the node; the fleet token and JSON content type by default. */
  headers?: Readonly<Record<string, string>>;
  /** The caller's team when it is limited to one: another team's sandbox is not destroyed. */
  team?: string;
}

/** Outcome of one node in `GatewayRouting.fanOut`. */
export type FanOutAnswer =
  | { node: FleetNode; ok: true; status: number; headers: Headers; json: unknown }
  | { node: FleetNode; ok: false; cause: string };
