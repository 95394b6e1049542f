/**
 * The node's egress proxy: where the kernel steers the port 80 and 443 connections of a sandbox
 * with domain rules or header transforms (an iptables REDIRECT per sandbox, `_egress.ts`). It
 * reads the name the sandbox asks for (the HTTP `Host`, the TLS SNI), judges it by the
 * sandbox's rules, resolves it itself and connects there: the address the sandbox connected to
 * is never used, so naming an allowed domain while connecting to a forbidden address reaches the
 * allowed domain's address, not the forbidden one.
 *
 * - A name matched by `allowDomains` is allowed; else one matched by `denyDomains` is refused;
 *   else the name is resolved and its address judged by the address rules.
 * - An IPv4 literal name is judged by the address rules; a TLS hello without SNI is refused (no
 *   name to judge; addresses in `allowOut` are never steered here, so they are reached direct).
 * - Loopback, link-local, multicast, this machine's own addresses and the sandbox bridges'
 *   subnets (`dm-*`, `docker*`, `br-*`) are refused whatever the rules say: the proxy runs on
 *   the host, so it must not become a way around the host firewall or the engine's isolation
 *   between containers.
 * - HTTPS to a name with a transform is terminated with a certificate the fleet egress CA signs
 *   (`_egress_ca.ts`), each request gets the transform's headers and goes on over HTTPS that
 *   verifies the upstream against Deno's root store plus `DORMICE_EGRESS_EXTRA_CA`. Everything
 *   else is spliced: the bytes pass untouched.
 *
 * Rules are looked up per connection by the sandbox's address; a replaced rule set cuts the
 * sandbox's open spliced connections it refuses, and an opened connection is judged again at
 * each request (its transforms too).
 *
 * This file accepts, judges and splices; beside it: reading and judging a name
 * (`_egress_names.ts`), the fair shares of the connection caps (`_egress_shares.ts`), the byte
 * plumbing (`_egress_wire.ts`) and the TLS-terminating path of names with transforms
 * (`_egress_transform.ts`).
 *
 * @module
 */
import { lookup } from "node:dns/promises";
import {
  egressAllows,
  type EgressRules,
  parseEgressEntry,
  transformsFor,
} from "../../../shared/egress_rules.ts";
import type { EgressCa } from "./_egress_ca.ts";
import type { Log } from "../../../shared/log.ts";
import { allows, cleanName, hostOf, isIpv4, judgeName, sniOf } from "./_egress_names.ts";
import { ConnectionShares, MAX_CONNECTIONS, MAX_PER_SANDBOX } from "./_egress_shares.ts";
import { MAX_CLIENTS, MAX_TERMINATORS, TransformPath } from "./_egress_transform.ts";
import {
  closeQuietly,
  connectWithin,
  MAX_HEAD,
  readHead,
  splice,
  writeAll,
} from "./_egress_wire.ts";

/**
 * Most name lookups in flight, node-wide and per sandbox. A lookup holds a thread of the
 * runtime's blocking pool (shared with file access) until the resolver gives up, however long
 * the proxy waits: names whose servers never answer must not take the node's pool.
 */
const MAX_LOOKUPS = 64;
const MAX_LOOKUPS_PER_SANDBOX = 16;
/**
 * Most listeners for ports other than 80 and 443 (transform keys with a port), node-wide: one
 * per egress bridge address and port, shared by the sandboxes whose rules name that port and
 * closed when none does any more (see {@linkcode EgressProxy.hold}).
 */
export const MAX_PORT_LISTENERS = 64;
/** How long the proxy waits for a name to resolve, ms. */
const LOOKUP_TIMEOUT_MS = 5_000;

/** Ranges the proxy never connects to: this host's own, link-local, multicast, reserved. */
const NEVER = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"];

function within(cidr: string, ip: string): boolean {
  return !egressAllows({ allowOut: [], denyOut: [cidr] }, ip);
}

/** Refused: the node has {@linkcode MAX_PORT_LISTENERS} port listeners open, all named. */
export class PortListenersFull extends Error {}

/** Refused at once: the sandbox (or the node) has too many lookups in flight. */
class LookupsBusy extends Error {}

/** Options of {@linkcode EgressProxy}. */
export interface EgressProxyOptions {
  /** The fleet egress CA, for names with header transforms. */
  ca: EgressCa;
  /** More CA certificates (PEM) upstreams of opened HTTPS may be signed by. */
  extraCaCerts?: string[];
  /** Names resolved here rather than by the system resolver (`DORMICE_EGRESS_HOSTS`). */
  hosts?: ReadonlyMap<string, string>;
  /** Where failures of the proxy itself are logged (never a header value). */
  log: Log;
  /** This machine's network interfaces; `Deno.networkInterfaces` by default (tests fake it). */
  interfaces?: () => Deno.NetworkInterfaceInfo[];
  /** Most names with a TLS terminator at once (128; tests lower it). */
  maxTerminators?: number;
  /** Most upstream HTTPS clients kept, one per name and address (256; tests lower it). */
  maxClients?: number;
  /** Opens a listener on an address, on a port of the system's choosing (tests fake it). */
  listen?: (hostname: string) => Deno.TcpListener;
  /** Resolves a name to an IPv4 address; the system resolver by default (tests fake it). */
  lookup?: (name: string) => Promise<string>;
  /** Most requests of one sandbox in flight to domains with transforms (512; tests lower it). */
  maxRequestsPerSandbox?: number;
  /**
   * Sends an opened connection's requests on; by default the upstream's own HTTP/1.1 client over
   * TLS to the address judged (tests fake it).
   */
  fetch?: typeof fetch;
}

/**
 * Interfaces whose subnets hold sandboxes or other containers: the node's own bridges
 * (`dm-<hash>-e`, `dm-<hash>-i`, named by `_network.ts`), Docker's default bridge and its
 * user-defined ones (`br-<id>`). The proxy connects from the host, where the engine's rules
 * that keep bridges apart do not apply, so it must refuse every address on them.
 */
const SANDBOX_BRIDGE = /^(dm-|docker|br-)/;

interface Sandbox {
  id: string;
  rules: EgressRules;
  /** Its team, when the node said: the caps are shared between teams first. */
  team?: string;
}

/** A listener for a transform key's port, and the sandboxes holding it open. */
interface PortListener {
  listener: Deno.TcpListener;
  /** The bridge interface its connections come in on, given back when it closes. */
  iface: string;
  /** Ids of the sandboxes holding it: its reference count. */
  holders: Set<string>;
}

/** A port listener closed because no sandbox names its port any more. */
export interface ReleasedPort {
  /** The bridge interface given at {@linkcode EgressProxy.hold}. */
  iface: string;
  /** The port the listener had (where the REDIRECTs sent the connections). */
  listener: number;
}

/** One spliced connection of a sandbox: what it was judged by, for a change of rules. */
interface Spliced {
  name: string;
  ip: string;
  conn: Deno.Conn;
}

/** The node's egress proxy (see the module doc). */
export class EgressProxy {
  #hosts: ReadonlyMap<string, string>;
  #log: Log;
  #interfaces: () => Deno.NetworkInterfaceInfo[];
  #lookup: (name: string) => Promise<string>;
  #open: (hostname: string) => Deno.TcpListener;
  /** The TLS-terminating path of names with header transforms. */
  #transforms: TransformPath;
  /** Lookups in flight by sandbox address. */
  #lookups = new Map<string, number>();
  #lookupsTotal = 0;
  /** By bridge address, for ports 80 and 443: one per egress network, kept while it is used. */
  #listeners = new Map<string, Deno.TcpListener>();
  /**
   * By `<address> <port>`, for a transform key's port; each removed when its last holder lets
   * go, so at most {@linkcode MAX_PORT_LISTENERS} at once.
   */
  #ports = new Map<string, PortListener>();
  /** By sandbox id: the keys of {@linkcode #ports} its latest {@linkcode hold} named. */
  #named = new Map<string, Set<string>>();
  #byAddress = new Map<string, Sandbox>();
  #byId = new Map<string, Sandbox>();
  /** Sandbox connections, by sandbox address, shared between teams and their sandboxes. */
  #shares = new ConnectionShares<Deno.Conn>(
    MAX_CONNECTIONS,
    MAX_PER_SANDBOX,
    (from) => this.#teamKey(this.#byAddress.get(from), `address ${from}`),
  );
  /** Spliced connections by sandbox id; each removed when it ends. */
  #spliced = new Map<string, Set<Spliced>>();
  #local: { at: number; addresses: string[]; subnets: string[] } = {
    at: 0,
    addresses: [],
    subnets: [],
  };

  constructor(
    {
      ca,
      extraCaCerts = [],
      hosts = new Map(),
      log,
      interfaces = Deno.networkInterfaces,
      maxTerminators = MAX_TERMINATORS,
      maxClients = MAX_CLIENTS,
      listen = (hostname) => Deno.listen({ hostname, port: 0 }),
      lookup: resolve = async (name) => (await lookup(name, { family: 4 })).address,
      maxRequestsPerSandbox = MAX_PER_SANDBOX,
      fetch: send,
    }: EgressProxyOptions,
  ) {
    this.#transforms = new TransformPath({
      ca,
      extraCaCerts,
      log,
      maxTerminators,
      maxClients,
      maxRequestsPerSandbox,
      fetch: send,
      rulesOf: (id) => this.#byId.get(id)?.rules,
      teamOf: (id) => this.#teamKey(this.#byId.get(id), `sandbox ${id}`),
    });
    this.#lookup = resolve;
    this.#open = listen;
    this.#interfaces = interfaces;
    this.#hosts = hosts;
    this.#log = log;
  }

  /**
   * Listens on `hostname` (an egress bridge's gateway address, where a REDIRECT delivers the
   * sandboxes' connections to ports 80 and 443) unless it listens there already; the port.
   *
   * @throws {Error} when the address cannot be listened on.
   */
  start(hostname: string): number {
    const known = this.#listeners.get(hostname);
    if (known !== undefined) return (known.addr as Deno.NetAddr).port;
    const listener = this.#listen(hostname);
    this.#listeners.set(hostname, listener);
    this.#accept(listener, (c) => this.#serve(c));
    return (listener.addr as Deno.NetAddr).port;
  }

  /**
   * Sandbox `id` needs listeners on `hostname` for `ports` (its transform keys' ports other
   * than 443, `api.example.com:8443`: a REDIRECT loses the port connected to, so each has a
   * listener of its own, taking the connections coming in on bridge `iface`). Each is opened
   * unless one is open already, and shared by every sandbox naming its port: `id` counts as a
   * holder of each, and goes on holding those of its earlier hold until {@linkcode release},
   * so a listener another sandbox (or this one's new rules) still names is never closed
   * between the two. At most {@linkcode MAX_PORT_LISTENERS} are open at once.
   *
   * @returns each port's listener port, for the REDIRECTs.
   * @throws {PortListenersFull} past that many (the holds this call took are given back).
   * @throws {Error} when the address cannot be listened on.
   */
  hold(id: string, hostname: string, ports: Iterable<number>, iface: string): Map<number, number> {
    const named = new Set<string>();
    const listeners = new Map<number, number>();
    try {
      for (const port of ports) {
        const at = `${hostname} ${port}`;
        named.add(at);
        let known = this.#ports.get(at);
        if (known === undefined) {
          if (this.#ports.size >= MAX_PORT_LISTENERS) {
            throw new PortListenersFull(
              `the egress proxy listens for ${MAX_PORT_LISTENERS} ports other than 80 and 443 ` +
                "already (transform keys with a port, each held until no sandbox's rules name " +
                "it): use keys without a port, or fewer ports",
            );
          }
          const listener = this.#listen(hostname);
          known = { listener, iface, holders: new Set() };
          this.#ports.set(at, known);
          this.#accept(listener, (c) => this.#serve(c, port));
        }
        known.holders.add(id);
        listeners.set(port, (known.listener.addr as Deno.NetAddr).port);
      }
    } catch (error) {
      // Back to what it held before this call: the listeners opened for it alone close.
      this.release(id);
      throw error;
    }
    this.#named.set(id, named);
    return listeners;
  }

  /**
   * Sandbox `id` lets go of the listeners its latest {@linkcode hold} did not name (all, after
   * {@linkcode forget}); each no sandbox holds any more is closed. Call it once the REDIRECTs
   * to them are gone. Connections a closed listener accepted run on until they end.
   *
   * @returns the listeners closed, for their host firewall rules to go too.
   */
  release(id: string): ReleasedPort[] {
    const keep = this.#named.get(id) ?? new Set<string>();
    const released: ReleasedPort[] = [];
    for (const [at, held] of this.#ports) {
      if (keep.has(at) || !held.holders.delete(id) || held.holders.size > 0) continue;
      this.#ports.delete(at);
      released.push({ iface: held.iface, listener: (held.listener.addr as Deno.NetAddr).port });
      try {
        held.listener.close();
      } catch { /* closed already */ }
    }
    return released;
  }

  /** A new listener on `hostname`, on a port of the system's choosing. */
  #listen(hostname: string): Deno.TcpListener {
    // A new bridge address: its subnet is read again before the next connection is judged.
    this.#local.at = 0;
    // Fails closed: without the host's addresses the proxy could not keep off them.
    this.#interfaces();
    // Bounded by the node's networks (its egress network, made again with another subnet after
    // it was removed) times the ports of MAX_PORT_LISTENERS.
    return this.#open(hostname);
  }

  /** How many listeners for transform keys' ports are open. */
  get portListeners(): number {
    return this.#ports.size;
  }

  /**
   * The sandbox at `ip` is `id` of `team`, judged by `rules` from its next connection on. The
   * proxy's connection caps are shared between teams first (see `ConnectionShares`); a sandbox
   * whose team is not given counts as a team of its own.
   */
  set(ip: string, id: string, rules: EgressRules, team?: string): void {
    for (const [at, s] of this.#byAddress) if (s.id === id) this.#byAddress.delete(at);
    const sandbox = { id, rules, team: team ?? this.#byId.get(id)?.team };
    this.#byAddress.set(ip, sandbox);
    this.#byId.set(id, sandbox);
    // Open connections the new rules refuse are cut, as the kernel cuts those to a denied
    // address (an opened HTTPS connection is judged again at its next request).
    for (const s of this.#spliced.get(id) ?? []) {
      if (!allows(rules, s.name, s.ip)) closeQuietly(s.conn);
    }
  }

  /**
   * Forgets sandbox `id`: its open connections are cut, new ones closed unanswered, and it lets
   * go of its port listeners ({@linkcode release}).
   *
   * @returns the listeners closed, for their host firewall rules to go too.
   */
  forget(id: string): ReleasedPort[] {
    for (const [at, s] of this.#byAddress) if (s.id === id) this.#byAddress.delete(at);
    this.#byId.delete(id);
    for (const s of this.#spliced.get(id) ?? []) closeQuietly(s.conn);
    this.#named.delete(id);
    return this.release(id);
  }

  /** The key `sandbox`'s connections are shared out by: its team's, else its own `other`. */
  #teamKey(sandbox: Sandbox | undefined, other: string): string {
    return sandbox?.team === undefined ? other : `team ${sandbox.team}`;
  }

  /** Stops listening and closes the TLS terminators. */
  async close(): Promise<void> {
    for (
      const l of [
        ...this.#listeners.values(),
        ...[...this.#ports.values()].map((p) => p.listener),
      ]
    ) {
      try {
        l.close();
      } catch { /* closed already */ }
    }
    this.#listeners.clear();
    this.#ports.clear();
    this.#named.clear();
    await this.#transforms.close();
  }

  #accept(listener: Deno.TcpListener, serve: (conn: Deno.Conn) => Promise<void>): void {
    (async () => {
      try {
        for await (const conn of listener) {
          const from = (conn.remoteAddr as Deno.NetAddr).hostname;
          if (!this.#shares.admit(from, conn, closeQuietly)) {
            closeQuietly(conn);
            continue;
          }
          // Small writes go at once: a hello or a request head must not wait for an ACK.
          conn.setNoDelay(true);
          serve(conn).catch(() => {}).finally(() => {
            this.#shares.release(from, conn);
            closeQuietly(conn);
          });
        }
      } catch (error) {
        if (!(error instanceof Deno.errors.BadResource)) {
          this.#log("warn", "The egress proxy stopped accepting connections", { error });
        }
      }
    })();
  }

  /** Serves one steered connection: to 80 or 443 by what it speaks, or to `forPort`. */
  async #serve(conn: Deno.Conn, forPort?: number): Promise<void> {
    const from = (conn.remoteAddr as Deno.NetAddr).hostname;
    const sandbox = this.#byAddress.get(from);
    if (sandbox === undefined) return;
    const head = await readHead(conn, (data) => {
      const sni = sniOf(data);
      if (sni !== undefined) return sni === null ? null : { tls: true, name: sni };
      const host = hostOf(data);
      // A request head that fills the buffer unfinished: answered, not dropped in silence.
      if (host === null && data.length >= MAX_HEAD) return { tls: false, name: "", big: true };
      return host === null ? null : { tls: false, name: host ?? "" };
    });
    if (head === null) return;
    const { tls, name: asked } = head.value;
    const refuse = async (why: string, status = "403 Forbidden") => {
      if (tls) return;
      const body = `dormice egress: ${why}\n`;
      await writeAll(
        conn,
        new TextEncoder().encode(
          `HTTP/1.1 ${status}\r\nContent-Type: text/plain\r\nConnection: close\r\n` +
            `Content-Length: ${body.length}\r\n\r\n${body}`,
        ),
      ).catch(() => {});
    };
    if ("big" in head.value) {
      return await refuse(
        `the request head is larger than ${MAX_HEAD - 5} bytes before its end, more than the ` +
          "egress proxy reads to find its Host: send fewer or shorter headers",
        "431 Request Header Fields Too Large",
      );
    }
    const name = cleanName(asked);
    if (name === null) {
      return await refuse(
        `the request names no host (${tls ? "no TLS SNI" : "no Host header"}), so the ` +
          "sandbox's domain rules cannot judge it",
      );
    }
    const rules = this.#byAddress.get(from)?.rules ?? sandbox.rules;
    const verdict = isIpv4(name) ? "address" : judgeName(rules, name);
    if (verdict === "deny") {
      return await refuse(`the sandbox's egress rules deny ${name}`);
    }
    let ip: string;
    try {
      ip = await this.#resolve(name, from);
    } catch (error) {
      if (error instanceof LookupsBusy) return await refuse(error.message);
      return await refuse(`${name} does not resolve (${(error as Error).message})`);
    }
    if (verdict === "address" && !egressAllows(rules, ip)) {
      return await refuse(`the sandbox's egress rules deny ${name} (${ip})`);
    }
    if (await this.#never(ip)) {
      return await refuse(`${name} resolves to ${ip}, an address of this host or its sandboxes`);
    }
    const port = forPort ?? (tls ? 443 : 80);
    const transforms = tls ? transformsFor(rules.transforms, name, port) : undefined;
    if (transforms !== undefined) {
      return await this.#transforms.open(conn, sandbox.id, name, ip, head.data, port);
    }
    let upstream: Deno.TcpConn;
    try {
      upstream = await connectWithin(ip, port);
    } catch (error) {
      return await refuse(`${name} (${ip}) cannot be reached: ${(error as Error).message}`);
    }
    try {
      await writeAll(upstream, head.data);
    } catch {
      upstream.close();
      return;
    }
    const live: Spliced = { name, ip, conn };
    const own = this.#spliced.get(sandbox.id) ?? new Set();
    this.#spliced.set(sandbox.id, own.add(live));
    // Rules replaced while this one connected were not applied to it: judged by them now.
    const now = this.#byId.get(sandbox.id)?.rules;
    if (now === undefined || !allows(now, name, ip)) closeQuietly(conn);
    try {
      await splice(conn, upstream);
    } finally {
      own.delete(live);
      if (own.size === 0 && this.#spliced.get(sandbox.id) === own) {
        this.#spliced.delete(sandbox.id);
      }
    }
  }

  /** The address `name` resolves to (IPv4): the hosts setting first, then the system. */
  async #resolve(name: string, from: string): Promise<string> {
    if (isIpv4(name)) return name;
    const mapped = this.#hosts.get(name);
    if (mapped !== undefined) return mapped;
    const own = this.#lookups.get(from) ?? 0;
    if (own >= MAX_LOOKUPS_PER_SANDBOX || this.#lookupsTotal >= MAX_LOOKUPS) {
      throw new LookupsBusy(
        `the egress proxy is resolving ${
          own >= MAX_LOOKUPS_PER_SANDBOX ? `${own} names for this sandbox` : "too many names"
        } at once already (names whose servers are slow to answer): try again shortly`,
      );
    }
    this.#lookups.set(from, own + 1);
    this.#lookupsTotal++;
    // Counted until the lookup itself ends, not when the proxy stops waiting for it.
    const pending = this.#lookup(name).finally(() => {
      this.#lookupsTotal--;
      const left = (this.#lookups.get(from) ?? 1) - 1;
      if (left > 0) this.#lookups.set(from, left);
      else this.#lookups.delete(from);
    });
    pending.catch(() => {});
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        pending,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`no answer within ${LOOKUP_TIMEOUT_MS} ms`)),
            LOOKUP_TIMEOUT_MS,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Whether `ip` is one the proxy never connects to. */
  async #never(ip: string): Promise<boolean> {
    if (NEVER.some((cidr) => within(cidr, ip))) return true;
    if (Date.now() - this.#local.at > 10_000) {
      const addresses: string[] = [];
      const subnets: string[] = [];
      for (const i of this.#interfaces()) {
        if (i.family !== "IPv4") continue;
        addresses.push(i.address);
        if (SANDBOX_BRIDGE.test(i.name)) {
          const bits = i.cidr.split("/")[1];
          const r = parseEgressEntry(`${i.address}/${bits}`);
          if (r.ok) subnets.push(r.cidr);
        }
      }
      this.#local = { at: Date.now(), addresses, subnets };
    }
    await Promise.resolve();
    return this.#local.addresses.includes(ip) || this.#local.subnets.some((c) => within(c, ip));
  }
}
