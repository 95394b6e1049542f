/**
 * Shared mode's record of recent creates: which node each create went to, kept in etcd where
 * every gateway reads it, so a lookup miss on one gateway asks the node another gateway placed a
 * name on even while that node's digest does not show it yet (docs/lookup-digest.md, "Several
 * gateways").
 *
 * @module
 */
import type { EtcdClient, EtcdKv } from "./client.ts";
import { EtcdRequestError } from "./client.ts";

/** Options of {@linkcode RecentCreates}. */
export interface RecentCreatesOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The fleet's key prefix, e.g. `/dormice/`; records live under `<prefix>recent/`. */
  prefix: string;
  /**
   * How long a record lives, in seconds (at least; records share a lease per `bucketSeconds`,
   * so one may live up to that much longer). The gateway passes the node-dead bound plus the
   * create bound and slack: see `recentCreatesTtlSeconds`.
   */
  ttlSeconds: number;
  /**
   * Records written within this many seconds share one lease. Default 10: a busy gateway grants
   * one lease per 10 s, not one per create, and etcd keeps at most `ttl / 10 + 1` of them.
   */
  bucketSeconds?: number;
  /** Milliseconds since the epoch; `Date.now` by default. */
  now?: () => number;
}

/** What a name's or an id's record holds. */
interface RecentRecord {
  /** The node the create was sent to. */
  node: string;
  /** When the creating gateway wrote it (ms since the epoch). */
  at: number;
}

/**
 * How long a recent create's record must live, in seconds, for the shared-mode digest rule to
 * hold: a gateway trusts a node's last digest while the node's last check-in is at most
 * `trustMs` old, so a record must outlive every create that digest may predate: the trust
 * window, plus the create's own bound (it may land that long after its record was written),
 * plus a check-in attempt's bound and slack for the gateways' clocks.
 *
 * @example
 * ```ts ignore
 * recentCreatesTtlSeconds(610_000, 120_000); // 745
 * ```
 */
export function recentCreatesTtlSeconds(trustMs: number, createBoundMs: number): number {
  return Math.ceil((trustMs + createBoundMs + 5_000 + 10_000) / 1000);
}

/**
 * The records of recent creates under `<prefix>recent/`: `n/<team>/<name>/@<node>` (one a node
 * the name was created on, so two owners are both asked: the conflict is found), `i/<id>`,
 * `s/<snapshot id>/@<node>` for a snapshot name taken again on that node (or a template build
 * finished there), and `t/<team>/<name>` for the template id and node of a team's newest
 * template build by that name,
 * each naming the node, tied to a lease of their own (never a gateway's session lease: a gateway that
 * dies mid-create must not take the record with it). A name's record is written in the same
 * transaction that checks the creator still holds the name's slot; an id's right after the node
 * answered, before the client hears it.
 *
 * @example
 * ```ts ignore
 * const recent = new RecentCreates({ client, prefix: "/dormice/", ttlSeconds: 745 });
 * const nodes = await recent.nodesFor("name", "default/agent-1"); // ["node-a"]
 * ```
 */
export class RecentCreates {
  readonly #client: EtcdClient;
  readonly #prefix: string;
  readonly #ttlSeconds: number;
  readonly #bucketMs: number;
  readonly #now: () => number;
  #lease: { id: Promise<string>; at: number } | undefined;

  /** Builds the records' writer and reader; nothing is asked until the first call. */
  constructor(options: RecentCreatesOptions) {
    this.#client = options.client;
    this.#prefix = `${options.prefix}recent/`;
    this.#ttlSeconds = options.ttlSeconds;
    this.#bucketMs = (options.bucketSeconds ?? 10) * 1000;
    this.#now = options.now ?? Date.now;
  }

  /** How long a record lives at least, in seconds. */
  get ttlSeconds(): number {
    return this.#ttlSeconds;
  }

  /**
   * In one transaction: checks that `slotKey` still holds `attempt` (this take's value) and
   * writes the name's record naming `nodeId`. Resolves `null` when written, or the slot's
   * holder (`undefined` for a free slot) when the slot is no longer this take's.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async publishName(
    slotKey: string,
    attempt: string,
    scopedName: string,
    nodeId: string,
  ): Promise<EtcdKv | undefined | null> {
    const put = async () => {
      const lease = await this.#currentLease();
      return await this.#client.txn(
        [{ key: slotKey, target: "VALUE", result: "EQUAL", value: attempt }],
        [{ op: "put", key: this.#nameKey(scopedName, nodeId), value: this.#value(nodeId), lease }],
        [{ op: "range", key: slotKey }],
      );
    };
    const result = await this.#retryingLease(put);
    if (result.succeeded) return null;
    return result.ranges[0]?.[0];
  }

  /**
   * Writes the record of a created sandbox's id, naming `nodeId`.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async publishId(id: string, nodeId: string): Promise<void> {
    await this.#retryingLease(async () => {
      const lease = await this.#currentLease();
      await this.#client.put(`${this.#prefix}i/${id}`, this.#value(nodeId), lease);
    });
  }

  /**
   * Records a create a node made behind the gateways' back (its pushed check-in's
   * `directCreate`): the name's record, and the id's once it is built.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async publishDirect(scopedName: string, id: string | undefined, nodeId: string): Promise<void> {
    await this.#retryingLease(async () => {
      const lease = await this.#currentLease();
      const value = this.#value(nodeId);
      await this.#client.txn([], [
        { op: "put", key: this.#nameKey(scopedName, nodeId), value, lease },
        ...(id === undefined
          ? []
          : [{ op: "put" as const, key: `${this.#prefix}i/${id}`, value, lease }]),
      ]);
    });
  }

  /**
   * Records that node `nodeId` took a new build under snapshot id `snapshotId`, which another
   * node may hold an older build of (its pushed check-in's `snapshotRetaken`): `s/<id>/@<node>`.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async publishRetaken(snapshotId: string, nodeId: string): Promise<void> {
    await this.#retryingLease(async () => {
      const lease = await this.#currentLease();
      await this.#client.put(
        `${this.#prefix}s/${snapshotId}/@${nodeId}`,
        this.#value(nodeId),
        lease,
      );
    });
  }

  /**
   * The nodes that recently took a new build under snapshot id `snapshotId`
   * ({@linkcode publishRetaken}); empty when none did. One read of that id's few keys.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async retakenOn(snapshotId: string): Promise<string[]> {
    const kvs = await this.#client.range(`${this.#prefix}s/${snapshotId}/@`);
    return kvs.map((kv) => kv.key.slice(kv.key.lastIndexOf("/@") + 2));
  }

  /**
   * Records that a build of the team's template `scopedName` (`<team>/<name>`) was placed on
   * `nodeId` under `templateId`: `t/<team>/<name>`, written inside the name's template slot, so
   * a build of the same name requested through another gateway before this one is advertised
   * keeps that id, and every gateway's lookup of the name asks that node.
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async publishTemplate(scopedName: string, templateId: string, nodeId: string): Promise<void> {
    await this.#retryingLease(async () => {
      const lease = await this.#currentLease();
      await this.#client.put(
        `${this.#prefix}t/${scopedName}`,
        JSON.stringify({ node: nodeId, at: this.#now(), template: templateId }),
        lease,
      );
    });
  }

  /**
   * The template id and node of the newest recent build of `scopedName`
   * ({@linkcode publishTemplate}), or undefined. One read of one key.
   *
   * @throws what the client throws when etcd cannot be asked, or for a record it cannot read.
   */
  async templateNamed(
    scopedName: string,
  ): Promise<{ templateId: string; node: string } | undefined> {
    const kv = await this.#client.get(`${this.#prefix}t/${scopedName}`);
    if (kv === null) return undefined;
    const record = JSON.parse(kv.value) as RecentRecord & { template?: unknown };
    if (typeof record?.node !== "string" || typeof record.template !== "string") {
      throw new Error(`the record of template build '${scopedName}' in etcd is not readable`);
    }
    return { templateId: record.template, node: record.node };
  }

  /**
   * The team's recent template build records ({@linkcode publishTemplate}): each name with its
   * template id and node. One read of the team's few keys (they live one lease).
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async templatesOf(
    team: string,
  ): Promise<{ name: string; templateId: string; node: string; key: string; value: string }[]> {
    const at = `${this.#prefix}t/${team}/`;
    const out = [];
    for (const kv of await this.#client.range(at)) {
      try {
        const record = JSON.parse(kv.value) as RecentRecord & { template?: unknown };
        if (typeof record?.node !== "string" || typeof record.template !== "string") continue;
        out.push({
          name: kv.key.slice(at.length),
          templateId: record.template,
          node: record.node,
          key: kv.key,
          value: kv.value,
        });
      } catch { /* not a record: it names no template */ }
    }
    return out;
  }

  /**
   * Drops the team's build records of template `templateId` (it was deleted): a rebuild of its
   * name then makes a new template, as with one gateway. A record written since by another
   * build is left alone (compare-and-delete).
   *
   * @throws what the client throws when etcd cannot be asked.
   */
  async forgetTemplate(team: string, templateId: string): Promise<void> {
    for (const r of await this.templatesOf(team)) {
      if (r.templateId === templateId) await this.#client.deleteIfValue(r.key, r.value);
    }
  }

  /**
   * The nodes recent creates of `key` (a team-scoped name, or an id) went to; empty when there is
   * no record. One read of one key (an id) or of one name's few keys (a name), never a range over
   * the fleet.
   *
   * @throws what the client throws when etcd cannot be asked: the caller then asks every node.
   */
  async nodesFor(by: "name" | "id", key: string): Promise<string[]> {
    const kvs = by === "name"
      ? await this.#client.range(`${this.#prefix}n/${key}/@`)
      : [await this.#client.get(`${this.#prefix}i/${key}`)].filter((kv) => kv !== null);
    return kvs.map((kv) => {
      try {
        const record = JSON.parse(kv.value) as RecentRecord;
        if (typeof record?.node === "string") return record.node;
      } catch { /* not ours: refused below */ }
      // A record this gateway cannot read names no node; the caller asks every node.
      throw new Error(`the record of recent create '${key}' in etcd is not readable: ${kv.value}`);
    });
  }

  /** The key of a name's record on one node: the name's records share the prefix `…/@`. */
  #nameKey(scopedName: string, nodeId: string): string {
    return `${this.#prefix}n/${scopedName}/@${nodeId}`;
  }

  #value(nodeId: string): string {
    return JSON.stringify({ node: nodeId, at: this.#now() } satisfies RecentRecord);
  }

  /** The lease of the current bucket, granted when the last one is `bucketSeconds` old. */
  #currentLease(): Promise<string> {
    const now = this.#now();
    if (this.#lease === undefined || now - this.#lease.at >= this.#bucketMs) {
      const id = this.#client.grant(this.#ttlSeconds + Math.ceil(this.#bucketMs / 1000));
      const lease = { id, at: now };
      this.#lease = lease;
      // A failed grant is not kept: the next call grants again.
      id.catch(() => {
        if (this.#lease === lease) this.#lease = undefined;
      });
    }
    return this.#lease.id;
  }

  /** Runs `write`; once more with a new lease when etcd no longer knows the bucket's lease. */
  async #retryingLease<T>(write: () => Promise<T>): Promise<T> {
    try {
      return await write();
    } catch (error) {
      if (!(error instanceof EtcdRequestError && error.leaseNotFound)) throw error;
      this.#lease = undefined;
      return await write();
    }
  }
}
