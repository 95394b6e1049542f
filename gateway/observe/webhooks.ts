/**
 * Lifecycle webhooks: every event is POSTed as JSON to `DORMICE_WEBHOOK_URL`, signed with
 * `DORMICE_WEBHOOK_SECRET`, off the request path.
 *
 * Delivery rules (why: a receiver that is down must never slow the fleet, and must get what it
 * missed once it is back):
 * - `send()` only appends to an in-memory queue and returns; one sender loop delivers the events
 *   one at a time, oldest first, so a receiver sees a sandbox's events in the order they happened;
 * - a 2xx is delivered; a network failure, a timeout, a 408, a 429 or a 5xx is retried with
 *   exponential backoff (0.5 s doubling to 30 s, with jitter) until it succeeds or grows too old;
 *   any other 4xx is the receiver refusing that event, which is dropped (a retry would be refused
 *   again, and would hold every later event behind it);
 * - the queue is bounded (10,000 events): when full, the oldest waiting event is dropped, since
 *   the latest state matters most to a receiver catching up; an event older than a day is dropped
 *   too. Drops are counted in `/metrics` (`dormice_gateway_webhook_events_dropped_total{reason}`)
 *   and logged when they start, not per event;
 * - events live in memory only: a gateway restart loses those not yet delivered.
 *
 * The signature (`X-Dormice-Signature: t=<unix seconds>,v1=<hex>`) is HMAC-SHA256 with the secret
 * over `<t>.<body>`: a receiver recomputes it over the raw body, compares in constant time, and
 * refuses a `t` more than five minutes from its clock (a replayed delivery). Retries keep the
 * event's `id` (also in `X-Dormice-Event-Id`), so a receiver drops a repeat.
 *
 * @module
 */
import { Counter, Gauge, type Registry } from "prom-client";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { ChangeLog, type Log, silentLog } from "../../shared/log.ts";
import { type LifecycleEventType, lifecycleEventTypes } from "../../shared/schemas.ts";
import { describeFetchFailure } from "../../shared/fetch_failure.ts";
import { asFetch, type FetchHandler } from "../../shared/fetch_handler.ts";

/** One lifecycle change as a webhook receives it (the JSON body). */
export interface LifecycleEvent {
  /** Unique per event and kept across retries: a receiver's key to drop repeats. */
  id: string;
  /** What happened. */
  type: LifecycleEventType;
  /** When it happened, ISO 8601. */
  at: string;
  /** The sandbox it happened to. */
  sandbox: { id: string; name: string; team: string };
  /** The node that holds (or held) it. */
  nodeId: string;
  /**
   * Why, as a short code: `placed` (created), `requested` (a client asked: pause, resume, kill),
   * `timeout` (its E2B deadline passed: killed as `timed_out`, or `paused` with autoPause),
   * `node_down` (its node stopped checking in).
   */
  reason: string;
  /** The same for a person: which verb, which node, how long silent. */
  detail: string;
  /** Who saw it: the gateway on its request path, or the node (carried by its check-in). */
  source: "gateway" | "node";
}

/** The header carrying the signature. */
export const SIGNATURE_HEADER = "x-dormice-signature";

/**
 * The signature header's value for `body` at `unixSeconds`: `t=<seconds>,v1=<hex HMAC-SHA256 of
 * "<seconds>.<body>">`.
 *
 * @example
 * ```ts
 * import { signWebhook } from "@dormice/cluster/gateway";
 * const header = await signWebhook("s".repeat(32), '{"id":"e1"}', 1_700_000_000);
 * console.log(header.startsWith("t=1700000000,v1=")); // true
 * ```
 */
export async function signWebhook(
  secret: string | CryptoKey,
  body: string,
  unixSeconds: number,
): Promise<string> {
  const key = typeof secret === "string" ? await hmacKey(secret) : secret;
  const mac = await crypto.subtle.sign(
    "HMAC",
    key,
    new TextEncoder().encode(`${unixSeconds}.${body}`),
  );
  return `t=${unixSeconds},v1=${hex(new Uint8Array(mac))}`;
}

/**
 * A receiver's check of a delivery: the signature matches `body` and its time is within
 * `toleranceSeconds` of `nowSeconds`. What a receiver in another language does is the same: parse
 * `t` and `v1`, recompute, compare in constant time.
 *
 * @example
 * ```ts
 * import { signWebhook, verifyWebhook } from "@dormice/cluster/gateway";
 * const secret = "s".repeat(32);
 * const header = await signWebhook(secret, "{}", 1_700_000_000);
 * await verifyWebhook(secret, "{}", header, { nowSeconds: 1_700_000_010 }); // true
 * ```
 */
export async function verifyWebhook(
  secret: string,
  body: string,
  header: string | null,
  options: { nowSeconds?: number; toleranceSeconds?: number } = {},
): Promise<boolean> {
  const { nowSeconds = Math.floor(Date.now() / 1000), toleranceSeconds = 300 } = options;
  const m = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(header ?? "");
  if (!m) return false;
  const t = Number(m[1]);
  if (Math.abs(nowSeconds - t) > toleranceSeconds) return false;
  const key = await crypto.subtle.importKey(
    "raw",
    new TextEncoder().encode(secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["verify"],
  );
  const given = new Uint8Array(m[2].match(/../g)!.map((b) => parseInt(b, 16)));
  // subtle.verify compares in constant time.
  return await crypto.subtle.verify("HMAC", key, given, new TextEncoder().encode(`${t}.${body}`));
}

/** Where lifecycle events go and how hard delivery tries (`createGateway`'s `webhook`). */
export interface WebhookOptions {
  /** Where events are POSTed (`DORMICE_WEBHOOK_URL`). */
  url: string;
  /** The signing secret (`DORMICE_WEBHOOK_SECRET`). */
  secret: string;
  /** The HTTP client; the global `fetch` by default. Any `(request) => Response` handler serves. */
  fetch?: FetchHandler;
  /** Events kept waiting at most; the oldest goes when a new one would exceed it. Default 10,000. */
  maxQueue?: number;
  /** Bound of one delivery attempt. Default 5000 ms: a receiver should answer at once. */
  timeoutMs?: number;
  /** First retry delay. Default 500 ms. */
  initialBackoffMs?: number;
  /** Longest retry delay. Default 30,000 ms, so a receiver back up hears within half a minute. */
  maxBackoffMs?: number;
  /** An event older than this is dropped instead of sent. Default one day. */
  maxAgeMs?: number;
  /** Source of the backoff's jitter, in [0, 1); `Math.random` by default. */
  random?: () => number;
}

/** Options of {@linkcode WebhookSender}. */
export interface WebhookSenderOptions extends WebhookOptions {
  /** Where drops and failures go, once per change; silent by default. */
  log?: Log;
  /** Time source for the signature's `t` and an event's age; the real clock by default. */
  clock?: Clock;
  /** Where the webhook series are registered (the gateway's `/metrics`); none by default. */
  registry?: Registry;
}

/** Why events were dropped, as the metric's label says. */
type DropReason = "queue_full" | "expired" | "refused";

/**
 * The delivery queue and its sender loop (see the module doc for the rules).
 *
 * @example
 * ```ts ignore
 * const webhooks = new WebhookSender({ url: "https://hooks.example.com/dormice", secret });
 * webhooks.send(event); // returns at once
 * await webhooks.close();
 * ```
 */
export class WebhookSender {
  readonly #url: string;
  readonly #key: Promise<CryptoKey>;
  readonly #fetch: typeof fetch;
  readonly #log: Log;
  readonly #changes: ChangeLog;
  readonly #clock: Clock;
  readonly #maxQueue: number;
  readonly #timeoutMs: number;
  readonly #initialBackoffMs: number;
  readonly #maxBackoffMs: number;
  readonly #maxAgeMs: number;
  readonly #random: () => number;
  /** Waiting events from `#head` on; slots before it are spent (compacted now and then). */
  #queue: (LifecycleEvent | undefined)[] = [];
  #head = 0;
  /** The event being delivered or waiting out its backoff; counted in the bound. */
  #current: LifecycleEvent | undefined;
  #pumping: Promise<void> | undefined;
  #closed = false;
  readonly #stop = new AbortController();
  #idleWaiters: (() => void)[] = [];
  readonly #metrics?: {
    queued: Counter<"type">;
    delivered: Counter<"outcome">;
    dropped: Record<DropReason, ReturnType<Counter<"reason">["labels"]>>;
  };

  /**
   * Builds the sender; nothing is sent until an event is.
   *
   * @throws {TypeError} when `url` is not an http(s) URL or `secret` is empty.
   */
  constructor(options: WebhookSenderOptions) {
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new TypeError(`Cannot create WebhookSender as 'url' is not a URL: '${options.url}'`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`Cannot create WebhookSender as 'url' is not http(s): '${options.url}'`);
    }
    if (!options.secret) throw new TypeError("Cannot create WebhookSender as 'secret' is empty");
    this.#url = parsed.href;
    this.#key = hmacKey(options.secret);
    this.#fetch = asFetch(options.fetch ?? globalThis.fetch);
    this.#log = options.log ?? silentLog;
    this.#changes = new ChangeLog(this.#log);
    this.#clock = options.clock ?? systemClock;
    this.#maxQueue = Math.max(1, options.maxQueue ?? 10_000);
    this.#timeoutMs = options.timeoutMs ?? 5000;
    this.#initialBackoffMs = options.initialBackoffMs ?? 500;
    this.#maxBackoffMs = options.maxBackoffMs ?? 30_000;
    this.#maxAgeMs = options.maxAgeMs ?? 24 * 3600 * 1000;
    this.#random = options.random ?? Math.random;
    if (options.registry) this.#metrics = this.#register(options.registry);
  }

  /** Events waiting or in delivery. */
  get pending(): number {
    return this.#queue.length - this.#head + (this.#current ? 1 : 0);
  }

  /**
   * Queues `event` and returns at once; the sender loop delivers it. When the queue is full the
   * oldest waiting event is dropped (counted and logged). After `close()` nothing is queued.
   */
  send(event: LifecycleEvent): void {
    if (this.#closed) return;
    this.#metrics?.queued.labels({ type: event.type }).inc();
    if (this.pending >= this.#maxQueue) {
      const oldest = this.#shift();
      if (oldest !== undefined) this.#drop("queue_full", oldest);
      else return this.#drop("queue_full", event); // a queue of one, held by the retried event
    }
    this.#queue.push(event);
    this.#pumping ??= this.#pump().finally(() => this.#pumping = undefined);
  }

  /**
   * Resolves once nothing is pending, or after `timeoutMs`; returns whether the queue emptied.
   * For tests and a graceful stop.
   */
  idle(timeoutMs = 10_000): Promise<boolean> {
    if (this.pending === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#idleWaiters = this.#idleWaiters.filter((w) => w !== done);
        resolve(false);
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve(true);
      };
      this.#idleWaiters.push(done);
    });
  }

  /** Stops the loop (an attempt in flight is aborted) and logs how many events were not sent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const left = this.pending;
    this.#stop.abort();
    await this.#pumping;
    if (left > 0) {
      this.#log("warn", "webhook events not delivered before the gateway stopped", {
        events: left,
      });
    }
  }

  #shift(): LifecycleEvent | undefined {
    if (this.#head >= this.#queue.length) return undefined;
    const event = this.#queue[this.#head];
    this.#queue[this.#head++] = undefined;
    // Spent slots are dropped once they are most of the array, so the array stays O(live).
    if (this.#head > 1024 && this.#head * 2 > this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#head = 0;
    }
    return event;
  }

  #drop(reason: DropReason, event: LifecycleEvent, cause?: string): void {
    this.#metrics?.dropped[reason].inc();
    const fields = {
      url: this.#url,
      reason,
      eventId: event.id,
      type: event.type,
      ...(cause ? { cause } : {}),
      queueLimit: this.#maxQueue,
    };
    if (reason === "refused") {
      // Each refusal says something about that event: log every one, they are rare.
      this.#log("warn", "the webhook receiver refused an event; it is dropped", fields);
      return;
    }
    this.#changes.report(
      "drops",
      reason,
      "warn",
      reason === "queue_full"
        ? "webhook queue full: the oldest events are being dropped (the receiver is down or slow)"
        : "webhook events older than their limit are being dropped",
      fields,
    );
  }

  async #pump(): Promise<void> {
    while (!this.#closed) {
      this.#current ??= this.#shift();
      const event = this.#current;
      if (event === undefined) break;
      if (this.#clock.now() - Date.parse(event.at) > this.#maxAgeMs) {
        this.#current = undefined;
        this.#drop("expired", event);
        continue;
      }
      let attempt = 0;
      while (!this.#closed && this.#current === event) {
        const outcome = await this.#deliver(event);
        if (outcome.kind === "delivered") {
          this.#current = undefined;
          this.#metrics?.delivered.labels({ outcome: "ok" }).inc();
          if (
            this.#changes.report("delivery", "ok", "info", "webhook deliveries succeed", {
              url: this.#url,
            })
          ) this.#changes.clear("drops");
          break;
        }
        if (outcome.kind === "refused") {
          this.#current = undefined;
          this.#metrics?.delivered.labels({ outcome: "refused" }).inc();
          this.#drop("refused", event, outcome.cause);
          break;
        }
        this.#metrics?.delivered.labels({ outcome: "failed" }).inc();
        this.#changes.report(
          "delivery",
          outcome.cause,
          "warn",
          "webhook delivery failed; retrying",
          {
            url: this.#url,
            cause: outcome.cause,
            pending: this.pending,
          },
        );
        const backoff = Math.min(this.#maxBackoffMs, this.#initialBackoffMs * 2 ** attempt++);
        // Jitter: many gateways retrying one receiver must not hit it in step.
        await sleep(backoff * (0.5 + this.#random() / 2), this.#stop.signal);
        if (this.#clock.now() - Date.parse(event.at) > this.#maxAgeMs) {
          this.#current = undefined;
          this.#drop("expired", event);
        }
      }
    }
    if (this.pending === 0) {
      const waiters = this.#idleWaiters;
      this.#idleWaiters = [];
      for (const w of waiters) w();
    }
  }

  async #deliver(
    event: LifecycleEvent,
  ): Promise<{ kind: "delivered" } | { kind: "refused" | "failed"; cause: string }> {
    const body = JSON.stringify(event);
    const signature = await signWebhook(
      await this.#key,
      body,
      Math.floor(this.#clock.now() / 1000),
    );
    let response: Response;
    try {
      response = await this.#fetch(this.#url, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "user-agent": "dormice-gateway",
          [SIGNATURE_HEADER]: signature,
          "x-dormice-event-id": event.id,
          "x-dormice-event-type": event.type,
        },
        body,
        redirect: "manual",
        signal: AbortSignal.any([this.#stop.signal, AbortSignal.timeout(this.#timeoutMs)]),
      });
    } catch (error) {
      return { kind: "failed", cause: describeFetchFailure(error) };
    }
    await response.body?.cancel().catch(() => {});
    const status = response.status;
    if (status >= 200 && status < 300) return { kind: "delivered" };
    if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
      return { kind: "refused", cause: `HTTP ${status}` };
    }
    return { kind: "failed", cause: `HTTP ${status}` };
  }

  #register(registry: Registry) {
    const registers = [registry];
    const queued = new Counter({
      name: "dormice_gateway_webhook_events_total",
      help: "Lifecycle events handed to the webhook queue, by type",
      labelNames: ["type"],
      registers,
    });
    for (const type of lifecycleEventTypes) queued.labels({ type });
    const delivered = new Counter({
      name: "dormice_gateway_webhook_deliveries_total",
      help:
        "Webhook delivery attempts by outcome: ok (2xx), failed (retried), refused (4xx, dropped)",
      labelNames: ["outcome"],
      registers,
    });
    const droppedCounter = new Counter({
      name: "dormice_gateway_webhook_events_dropped_total",
      help: "Lifecycle events never delivered: queue_full, expired (older than a day), refused",
      labelNames: ["reason"],
      registers,
    });
    const pending = () => this.pending;
    new Gauge({
      name: "dormice_gateway_webhook_queue_events",
      help: "Lifecycle events waiting for delivery (or in delivery)",
      registers,
      collect() {
        this.set(pending());
      },
    });
    const dropped = {
      queue_full: droppedCounter.labels({ reason: "queue_full" }),
      expired: droppedCounter.labels({ reason: "expired" }),
      refused: droppedCounter.labels({ reason: "refused" }),
    };
    for (const child of Object.values(dropped)) child.inc(0);
    return { queued, delivered, dropped };
  }
}

function hmacKey(secret: string): Promise<CryptoKey> {
  return crypto.subtle.importKey(
    "raw",
    new TextEncoder().encode(secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
}

function hex(bytes: Uint8Array): string {
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

/** Waits `ms`, or less when `signal` aborts (never rejects). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
