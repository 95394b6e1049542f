/**
 * Shared mode (several gateways over one etcd): the etcd client and lease session, the records
 * of recent creates, the name slots, the team ledger, and the fleet and key syncs that
 * `buildGateway` (`app.ts`) starts when `etcd` is given.
 *
 * @module
 */
import { RecentCreates, recentCreatesTtlSeconds } from "./etcd/recent.ts";
import type { RecentLookup } from "./finder/finder.ts";
import type { Fleet } from "./fleet/fleet.ts";
import type { ApiKeys } from "./keys/keys.ts";
import { EtcdTeamLedger, type TeamLedger } from "./keys/team_ledger.ts";
import { EtcdClient } from "./etcd/client.ts";
import { EtcdSession } from "./etcd/session.ts";
import { EtcdSlots, type Slots } from "./routing/slots.ts";
import { FleetSync } from "./fleet/sync.ts";
import { KeySync } from "./keys/sync.ts";
import type { Clock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { asFetch } from "../shared/fetch_handler.ts";
import type { SharedMode, SharedModeOptions } from "./app_types.ts";

/** Starts shared mode's pieces for one gateway: its syncs run, its lease is asked for at once. */
export function startShared(
  options: SharedModeOptions,
  fleet: Fleet,
  keys: ApiKeys,
  fetchFn: typeof fetch,
  log: Log,
  clock: Clock,
  deadAfterMs: number,
): {
  mode: SharedMode;
  slots: Slots;
  ledger: TeamLedger;
  recent: RecentLookup & { records: RecentCreates };
} {
  const prefix = options.prefix ?? "/dormice/";
  const client = new EtcdClient({
    endpoints: options.endpoints,
    fetch: options.fetch ? asFetch(options.fetch) : fetchFn,
  });
  const session = new EtcdSession({ client, ttlSeconds: options.leaseSeconds, log });
  // A node's digest is trusted while its last check-in is younger than the time after which it
  // is declared dead (or 10 minutes, when none is declared), and every create's record outlives
  // that window plus the create's own bound (docs/lookup-digest.md, "Several gateways").
  const trustMs = (deadAfterMs > 0 ? deadAfterMs : 600_000) + 10_000;
  const records = new RecentCreates({
    client,
    prefix,
    ttlSeconds: recentCreatesTtlSeconds(trustMs, 120_000),
  });
  const slots = new EtcdSlots({ client, session, prefix, recent: records });
  const sync = new FleetSync({ client, prefix, fleet, pollMs: options.pollMs, log });
  const keySync = new KeySync({ client, prefix, keys, pollMs: options.pollMs, log, clock });
  sync.start();
  keySync.start();
  // The lease at once, so a first create does not pay for it and an unreachable etcd is logged
  // at boot rather than at the first create.
  void session.lease().catch(() => {});
  let closing: Promise<void> | undefined;
  return {
    slots,
    recent: { records, trustMs, nodesFor: (by, key) => records.nodesFor(by, key) },
    ledger: new EtcdTeamLedger({ client, session, prefix, clock }),
    mode: {
      client,
      session,
      sync,
      keySync,
      close: () =>
        closing ??= Promise.all([sync.stop(), keySync.stop()]).then(() => session.close()),
    },
  };
}
