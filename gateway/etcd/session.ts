/**
 * The gateway's etcd lease, which every slot it holds in shared mode is written under.
 *
 * @module
 */
import { type Log, silentLog } from "../../shared/log.ts";
import type { EtcdClient } from "./client.ts";

/** Options of {@linkcode EtcdSession}. */
export interface EtcdSessionOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /**
   * The lease's TTL in seconds (`DORMICE_GATEWAY_ETCD_LEASE_SECONDS`). Default 10: a gateway that
   * dies mid-create holds its names' slots at most this long, and a keep-alive every third of it
   * survives two lost renewals before the lease lapses.
   */
  ttlSeconds?: number;
  /** Where the lease's changes go. */
  log?: Log;
}

/**
 * The gateway's lease: granted on first use, renewed every third of its TTL while the gateway
 * lives, so every slot it holds vanishes within one TTL of its death (SIGKILL included). A
 * renewal that finds the lease expired (etcd was unreachable for longer than the TTL) grants a
 * new one and says so: slots held under the old one may have been taken by another gateway.
 *
 * @example
 * ```ts ignore
 * const session = new EtcdSession({ client, ttlSeconds: 10 });
 * const lease = await session.lease();
 * await session.close();
 * ```
 */
export class EtcdSession {
  /** Unique per process: written into the slots this gateway holds, for the operator. */
  readonly owner: string = crypto.randomUUID();
  readonly ttlSeconds: number;
  readonly #client: EtcdClient;
  readonly #log: Log;
  #lease: Promise<string> | null = null;
  #timer: ReturnType<typeof setInterval> | undefined;
  #closed = false;
  /** Whether the last renewal reached etcd; read by the 503 fast path and the log. */
  #reachable = true;

  /** Builds the session; the lease is granted on the first `lease()`. */
  constructor(options: EtcdSessionOptions) {
    this.#client = options.client;
    this.ttlSeconds = options.ttlSeconds ?? 10;
    this.#log = options.log ?? silentLog;
  }

  /**
   * The live lease's id, granting one first when there is none.
   *
   * @throws {EtcdUnavailableError} when etcd does not answer.
   */
  lease(): Promise<string> {
    if (this.#closed) return Promise.reject(new Error("The etcd session is closed"));
    if (this.#lease === null) {
      const granting = this.#client.grant(this.ttlSeconds).then((id) => {
        this.#setReachable(true);
        this.#log("info", "etcd lease granted", { lease: id, ttlSeconds: this.ttlSeconds });
        this.#startRenewing();
        return id;
      }, (error) => {
        if (this.#lease === granting) this.#lease = null;
        this.#setReachable(false, error);
        throw error;
      });
      this.#lease = granting;
    }
    return this.#lease;
  }

  /**
   * Forgets `lease` when etcd said it no longer exists, so the next `lease()` grants a new one.
   *
   * @example
   * ```ts ignore
   * if (error instanceof EtcdRequestError && error.leaseNotFound) session.invalidate(id);
   * ```
   */
  async invalidate(lease: string): Promise<void> {
    const current = this.#lease;
    if (current === null) return;
    const id = await current.catch(() => null);
    if (id === lease && this.#lease === current) {
      this.#log("warn", "the gateway's etcd lease had expired: names it held may be taken", {
        lease: id,
        ttlSeconds: this.ttlSeconds,
      });
      clearInterval(this.#timer);
      this.#lease = null;
    }
  }

  /** Stops renewing and revokes the lease (its slots are freed at once, not after the TTL). */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    const lease = this.#lease;
    this.#lease = null;
    if (lease) await lease.then((id) => this.#client.revoke(id)).catch(() => {});
  }

  #startRenewing(): void {
    clearInterval(this.#timer);
    this.#timer = setInterval(() => void this.#renew(), (this.ttlSeconds * 1000) / 3);
  }

  async #renew(): Promise<void> {
    const current = this.#lease;
    if (current === null || this.#closed) return;
    let id: string;
    try {
      id = await current;
    } catch {
      return;
    }
    try {
      const ttl = await this.#client.keepAlive(id);
      this.#setReachable(true);
      if (ttl > 0 || this.#lease !== current) return;
      await this.invalidate(id);
      await this.lease().catch(() => {});
    } catch (error) {
      this.#setReachable(false, error);
    }
  }

  #setReachable(reachable: boolean, error?: unknown): void {
    if (reachable === this.#reachable) return;
    this.#reachable = reachable;
    if (reachable) this.#log("info", "etcd is reachable again", {});
    else {
      this.#log("error", "etcd is unreachable: creates and destroys answer 503 until it returns", {
        error: (error as Error)?.message ?? String(error),
      });
    }
  }
}
