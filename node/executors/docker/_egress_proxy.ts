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
 * @module
 */
import { lookup } from "node:dns/promises";
import {
  domainMatches,
  egressAllows,
  type EgressRules,
  parseEgressEntry,
  transformsFor,
} from "../../../shared/egress_rules.ts";
import type { EgressCa } from "./_egress_ca.ts";
import type { Log } from "../../../shared/log.ts";

/** Most bytes read before the name is known (a TLS hello record, an HTTP request head). */
const MAX_HEAD = 16 * 1024 + 5;
/** How long a sandbox has to send its hello or request head, ms. */
const HEAD_TIMEOUT_MS = 10_000;
/** How long a connection upstream may take, ms. */
const CONNECT_TIMEOUT_MS = 10_000;
/** Most sandbox connections through the proxy at once (see {@linkcode ConnectionShares}). */
const MAX_CONNECTIONS = 4096;
/** Most connections of one sandbox at once. */
const MAX_PER_SANDBOX = 512;
/**
 * Most name lookups in flight, node-wide and per sandbox. A lookup holds a thread of the
 * runtime's blocking pool (shared with file access) until the resolver gives up, however long
 * the proxy waits: names whose servers never answer must not take the node's pool.
 */
const MAX_LOOKUPS = 64;
const MAX_LOOKUPS_PER_SANDBOX = 16;
/** How long the proxy waits for a name to resolve, ms. */
const LOOKUP_TIMEOUT_MS = 5_000;
/**
 * Most names with a TLS terminator at once; past it the least recently used one no connection
 * is open through is closed (never one in use: that would cut another sandbox's connections).
 */
const MAX_TERMINATORS = 128;
/**
 * Most upstream HTTPS clients kept (one per name and address); past it the least recently used
 * one no opened connection goes on with is closed.
 */
const MAX_CLIENTS = 256;

/** What the proxy decides for a name under a sandbox's rules. */
export type Verdict = "allow" | "deny" | "address";

/**
 * How `rules` judge the host name `name`: allowed by a domain in `allowDomains`, refused by one
 * in `denyDomains`, else left to the address it resolves to (`"address"`).
 *
 * @example
 * ```ts
 * import { judgeName } from "./_egress_proxy.ts";
 * judgeName({ allowOut: [], denyOut: ["0.0.0.0/0"], allowDomains: ["*.a.test"] }, "x.a.test"); // "allow"
 * ```
 */
export function judgeName(rules: EgressRules, name: string): Verdict {
  if (rules.allowDomains?.some((p) => domainMatches(p, name))) return "allow";
  if (rules.denyDomains?.some((p) => domainMatches(p, name))) return "deny";
  return "address";
}

/**
 * The server name of a TLS ClientHello record (`data` starting with the record header), `""`
 * for a hello without one, `null` when `data` is not a whole ClientHello record yet, or
 * `undefined` when it is not TLS at all.
 */
export function sniOf(data: Uint8Array): string | null | undefined {
  if (data.length < 1 || data[0] !== 0x16) return undefined;
  if (data.length < 5) return null;
  const end = 5 + ((data[3] << 8) | data[4]);
  if (data.length < end) return null;
  let p = 5;
  const need = (n: number) => p + n <= end;
  if (!need(4) || data[p] !== 1) return undefined;
  p += 4 + 2 + 32;
  if (!need(1)) return undefined;
  p += 1 + data[p];
  if (!need(2)) return undefined;
  p += 2 + ((data[p] << 8) | data[p + 1]);
  if (!need(1)) return undefined;
  p += 1 + data[p];
  if (!need(2)) return "";
  const extEnd = Math.min(end, p + 2 + ((data[p] << 8) | data[p + 1]));
  p += 2;
  while (p + 4 <= extEnd) {
    const type = (data[p] << 8) | data[p + 1];
    const len = (data[p + 2] << 8) | data[p + 3];
    p += 4;
    if (type === 0 && p + 5 <= extEnd) {
      const nameLen = (data[p + 3] << 8) | data[p + 4];
      if (data[p + 2] !== 0 || p + 5 + nameLen > extEnd) return undefined;
      return new TextDecoder().decode(data.subarray(p + 5, p + 5 + nameLen));
    }
    p += len;
  }
  return "";
}

/**
 * The `Host` of an HTTP request head in `data`, without its port; `null` when the head is not
 * complete yet, `undefined` when it has no Host or is not HTTP.
 */
export function hostOf(data: Uint8Array): string | null | undefined {
  const text = new TextDecoder("latin1").decode(data);
  const end = text.indexOf("\r\n\r\n");
  if (end < 0) return /^[A-Z]{3,10} /.test(text) || text.length < 10 ? null : undefined;
  const m = /\r\nhost:[ \t]*([^\r\n]*)/i.exec(text.slice(0, end + 2));
  if (!m) return undefined;
  return m[1].trim().replace(/:\d+$/, "");
}

/** Lowercase, no trailing dot; `null` for what is no host name or IPv4 address. */
function cleanName(name: string): string | null {
  const n = name.toLowerCase().replace(/\.$/, "");
  return /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/.test(n) ? n : null;
}

function isIpv4(name: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(name) && parseEgressEntry(name).ok;
}

/** Ranges the proxy never connects to: this host's own, link-local, multicast, reserved. */
const NEVER = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"];

function within(cidr: string, ip: string): boolean {
  return !egressAllows({ allowOut: [], denyOut: [cidr] }, ip);
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* closed already */ }
}

async function writeAll(conn: Deno.Conn, data: Uint8Array): Promise<void> {
  let off = 0;
  while (off < data.length) off += await conn.write(data.subarray(off));
}

/** Copies `from` to `to` until `from` ends, then half-closes `to`. */
async function pump(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(64 * 1024);
  try {
    for (;;) {
      const n = await from.read(buf);
      if (n === null) break;
      await writeAll(to, buf.subarray(0, n));
    }
  } catch { /* either side gone: the other is closed below */ }
  try {
    await to.closeWrite();
  } catch { /* closed already */ }
}

async function splice(a: Deno.Conn, b: Deno.Conn): Promise<void> {
  await Promise.all([pump(a, b), pump(b, a)]);
  for (const c of [a, b]) {
    try {
      c.close();
    } catch { /* closed already */ }
  }
}

/** A TCP connection to `ip:port` within the connect bound. */
async function connectWithin(ip: string, port: number): Promise<Deno.TcpConn> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const attempt = Deno.connect({ hostname: ip, port }).then((c) => {
    c.setNoDelay(true);
    return c;
  });
  try {
    return await Promise.race([
      attempt,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${CONNECT_TIMEOUT_MS} ms`)),
          CONNECT_TIMEOUT_MS,
        );
      }),
    ]);
  } catch (error) {
    attempt.then((c) => c.close(), () => {});
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Who holds the proxy's connections: at most `perSource` each and `max` in all, shared fairly.
 * With the node full, a newcomer holding fewer than an even share (`max` over the sources
 * holding any, itself counted) is admitted by closing the oldest connection of the source
 * holding the most; one at or over its share is refused. So a few sandboxes (one tenant's, or
 * connections held idle on purpose) can fill the node while nobody else asks, and never keep
 * another sandbox from its share.
 *
 * @example
 * ```ts
 * import { ConnectionShares } from "./_egress_proxy.ts";
 * const shares = new ConnectionShares<string>(2, 2);
 * shares.admit("a", "a1", () => {}); // true
 * shares.admit("a", "a2", () => {}); // true: the node is full now
 * shares.admit("b", "b1", (x) => console.log(`closed ${x}`)); // true, after "closed a1"
 * ```
 */
export class ConnectionShares<T> {
  #max: number;
  #perSource: number;
  #held = new Map<string, Set<T>>();
  #total = 0;

  constructor(max: number, perSource: number) {
    this.#max = max;
    this.#perSource = perSource;
  }

  /** How many connections are held in all. */
  get total(): number {
    return this.#total;
  }

  /**
   * Admits `item` of `source`, closing (`evict`) another source's oldest item when that is its
   * share's price; false when `source` may not have one more.
   */
  admit(source: string, item: T, evict: (item: T) => void): boolean {
    const own = this.#held.get(source);
    const count = own?.size ?? 0;
    if (count >= this.#perSource) return false;
    if (this.#total >= this.#max) {
      const sources = this.#held.size + (own === undefined ? 1 : 0);
      if (count >= Math.floor(this.#max / sources)) return false;
      let biggest: [string, Set<T>] | undefined;
      for (const entry of this.#held) {
        if (biggest === undefined || entry[1].size > biggest[1].size) biggest = entry;
      }
      // The biggest holds more than an even share (the total is max, this one holds less).
      const oldest = biggest![1].values().next().value as T;
      this.release(biggest![0], oldest);
      evict(oldest);
    }
    if (own === undefined) this.#held.set(source, new Set([item]));
    else own.add(item);
    this.#total++;
    return true;
  }

  /** `item` of `source` is gone (a no-op when it was evicted or never admitted). */
  release(source: string, item: T): void {
    const own = this.#held.get(source);
    if (own === undefined || !own.delete(item)) return;
    this.#total--;
    if (own.size === 0) this.#held.delete(source);
  }
}

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
  /** Resolves a name to an IPv4 address; the system resolver by default (tests fake it). */
  lookup?: (name: string) => Promise<string>;
  /** Most requests of one sandbox in flight to domains with transforms (512; tests lower it). */
  maxRequestsPerSandbox?: number;
  /** Sends an opened connection's requests on; `fetch` by default (tests fake it). */
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
}

/** One opened HTTPS connection: whose it is, for which name, and the client it goes on with. */
interface Opened {
  id: string;
  name: string;
  ip: string;
  client: Deno.HttpClient;
}

/** One spliced connection of a sandbox: what it was judged by, for a change of rules. */
interface Spliced {
  name: string;
  ip: string;
  conn: Deno.Conn;
}

/** Whether `rules` let a sandbox reach `name` at `ip` (judged by name, else by address). */
function allows(rules: EgressRules, name: string, ip: string): boolean {
  const verdict = isIpv4(name) ? "address" : judgeName(rules, name);
  return verdict === "allow" || (verdict === "address" && egressAllows(rules, ip));
}

/**
 * The HTTPS client to one name at one address: kept, as building one (its root store) costs
 * more than a request. Its CONNECTs go to the proxy's own tunnel, which the key pins to the
 * address judged.
 */
interface Upstream {
  client: Deno.HttpClient;
  key: string;
  ip: string;
}

interface Terminator {
  server: Deno.HttpServer;
  port: number;
}

/** The node's egress proxy (see the module doc). */
export class EgressProxy {
  #ca: EgressCa;
  #extraCa: string[];
  #hosts: ReadonlyMap<string, string>;
  #log: Log;
  #interfaces: () => Deno.NetworkInterfaceInfo[];
  #maxTerminators: number;
  #maxClients: number;
  #lookup: (name: string) => Promise<string>;
  #fetch: typeof fetch;
  #requestsPerSandbox: number;
  /** Requests of opened connections in flight, by sandbox id, shared as connections are. */
  #requests: ConnectionShares<AbortController>;
  /** The same requests, for close() to abort (a terminator's shutdown waits for its requests). */
  #inFlight = new Set<AbortController>();
  /** Lookups in flight by sandbox address. */
  #lookups = new Map<string, number>();
  #lookupsTotal = 0;
  #listeners = new Map<string, Deno.TcpListener>();
  #byAddress = new Map<string, Sandbox>();
  #byId = new Map<string, Sandbox>();
  #shares = new ConnectionShares<Deno.Conn>(MAX_CONNECTIONS, MAX_PER_SANDBOX);
  /** The proxy's own CONNECTs (its HTTPS clients'), at most one per sandbox connection. */
  #tunnels = 0;
  #opened = new Map<number, Opened>();
  /** Spliced connections by sandbox id; each removed when it ends. */
  #spliced = new Map<string, Set<Spliced>>();
  #upstreams = new Map<string, Upstream>();
  #byKey = new Map<string, Upstream>();
  #terminators = new Map<string, Promise<Terminator>>();
  #connectListener: Deno.TcpListener | null = null;
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
      lookup: resolve = async (name) => (await lookup(name, { family: 4 })).address,
      maxRequestsPerSandbox = MAX_PER_SANDBOX,
      fetch: send = fetch,
    }: EgressProxyOptions,
  ) {
    this.#fetch = send;
    this.#requestsPerSandbox = maxRequestsPerSandbox;
    this.#requests = new ConnectionShares(MAX_CONNECTIONS, maxRequestsPerSandbox);
    this.#lookup = resolve;
    this.#maxClients = maxClients;
    this.#maxTerminators = maxTerminators;
    this.#ca = ca;
    this.#interfaces = interfaces;
    this.#extraCa = extraCaCerts;
    this.#hosts = hosts;
    this.#log = log;
  }

  /**
   * Listens on `hostname` (an egress bridge's gateway address, where a REDIRECT delivers)
   * unless it listens there already; the port.
   */
  start(hostname: string): number {
    const known = this.#listeners.get(hostname);
    if (known !== undefined) return (known.addr as Deno.NetAddr).port;
    // A new bridge address: its subnet is read again before the next connection is judged.
    this.#local.at = 0;
    // Fails closed: without the host's addresses the proxy could not keep off them.
    this.#interfaces();
    if (this.#connectListener === null) {
      this.#connectListener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      this.#accept(this.#connectListener, (c) => this.#tunnel(c), false);
    }
    // One a bridge address: bounded by the node's networks (its egress network, made again
    // with another subnet after it was removed).
    const listener = Deno.listen({ hostname, port: 0 });
    this.#listeners.set(hostname, listener);
    this.#accept(listener, (c) => this.#serve(c), true);
    return (listener.addr as Deno.NetAddr).port;
  }

  /** The sandbox at `ip` is `id`, judged by `rules` from its next connection on. */
  set(ip: string, id: string, rules: EgressRules): void {
    for (const [at, s] of this.#byAddress) if (s.id === id) this.#byAddress.delete(at);
    const sandbox = { id, rules };
    this.#byAddress.set(ip, sandbox);
    this.#byId.set(id, sandbox);
    // Open connections the new rules refuse are cut, as the kernel cuts those to a denied
    // address (an opened HTTPS connection is judged again at its next request).
    for (const s of this.#spliced.get(id) ?? []) {
      if (!allows(rules, s.name, s.ip)) closeQuietly(s.conn);
    }
  }

  /** Forgets sandbox `id`: its open connections are cut, new ones closed unanswered. */
  forget(id: string): void {
    for (const [at, s] of this.#byAddress) if (s.id === id) this.#byAddress.delete(at);
    this.#byId.delete(id);
    for (const s of this.#spliced.get(id) ?? []) closeQuietly(s.conn);
  }

  /** Stops listening and closes the TLS terminators. */
  async close(): Promise<void> {
    for (const l of [...this.#listeners.values(), this.#connectListener]) {
      try {
        l?.close();
      } catch { /* closed already */ }
    }
    this.#listeners.clear();
    this.#connectListener = null;
    for (const request of this.#inFlight) request.abort(new Error("the egress proxy stopped"));
    for (const t of this.#terminators.values()) {
      await t.then((x) => x.server.shutdown(), () => {});
    }
    this.#terminators.clear();
    for (const u of this.#upstreams.values()) u.client.close();
    this.#upstreams.clear();
    this.#byKey.clear();
  }

  #accept(
    listener: Deno.TcpListener,
    serve: (conn: Deno.Conn) => Promise<void>,
    perSource: boolean,
  ): void {
    (async () => {
      try {
        for await (const conn of listener) {
          const from = (conn.remoteAddr as Deno.NetAddr).hostname;
          let admitted: boolean;
          if (perSource) admitted = this.#shares.admit(from, conn, closeQuietly);
          else {
            admitted = this.#tunnels < MAX_CONNECTIONS;
            if (admitted) this.#tunnels++;
          }
          if (!admitted) {
            closeQuietly(conn);
            continue;
          }
          // Small writes go at once: a hello or a request head must not wait for an ACK.
          conn.setNoDelay(true);
          serve(conn).catch(() => {}).finally(() => {
            if (perSource) this.#shares.release(from, conn);
            else this.#tunnels--;
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

  /** Reads what `conn` sends until `parse` knows its answer, within the head bounds. */
  async #head<T>(
    conn: Deno.Conn,
    parse: (data: Uint8Array) => T | null,
  ): Promise<{ data: Uint8Array; value: T } | null> {
    const buf = new Uint8Array(MAX_HEAD);
    let have = 0;
    const timer = setTimeout(() => {
      try {
        conn.close();
      } catch { /* closed already */ }
    }, HEAD_TIMEOUT_MS);
    try {
      while (have < MAX_HEAD) {
        const n = await conn.read(buf.subarray(have));
        if (n === null) return null;
        have += n;
        const data = buf.subarray(0, have);
        const value = parse(data);
        if (value !== null) return { data, value };
      }
      return null;
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  async #serve(conn: Deno.Conn): Promise<void> {
    const from = (conn.remoteAddr as Deno.NetAddr).hostname;
    const sandbox = this.#byAddress.get(from);
    if (sandbox === undefined) return;
    const head = await this.#head(conn, (data) => {
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
    const transforms = tls ? transformsFor(rules.transforms, name) : undefined;
    if (transforms !== undefined) return await this.#open(conn, sandbox.id, name, ip, head.data);
    let upstream: Deno.TcpConn;
    try {
      upstream = await connectWithin(ip, tls ? 443 : 80);
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

  /**
   * Terminates the sandbox's TLS for `name` with the CA's certificate: the connection is handed
   * to the name's terminator, which adds the headers of the sandbox's current rules to every
   * request and sends it on to `ip`.
   */
  async #open(conn: Deno.Conn, id: string, name: string, ip: string, hello: Uint8Array) {
    let terminator: Terminator;
    let upstream: Upstream;
    try {
      terminator = await this.#terminator(name);
      upstream = this.#upstream(name, ip);
    } catch (error) {
      this.#log("warn", "The egress proxy could not open HTTPS for a domain with transforms", {
        domain: name,
        error,
      });
      return;
    }
    const inner = await Deno.connect({ hostname: "127.0.0.1", port: terminator.port });
    inner.setNoDelay(true);
    const opened: Opened = { id, name, ip, client: upstream.client };
    const port = (inner.localAddr as Deno.NetAddr).port;
    this.#opened.set(port, opened);
    try {
      await writeAll(inner, hello);
      await splice(conn, inner);
    } finally {
      this.#opened.delete(port);
    }
  }

  /** The kept HTTPS client to `name` at `ip`, made on first use. */
  #upstream(name: string, ip: string): Upstream {
    const at = `${name} ${ip}`;
    const known = this.#upstreams.get(at);
    if (known !== undefined) {
      // Most recently used last: the first is the one to close.
      this.#upstreams.delete(at);
      this.#upstreams.set(at, known);
      return known;
    }
    if (this.#upstreams.size >= this.#maxClients) {
      // The least recently used no opened connection goes on with: closing one in use would
      // fail another sandbox's requests in flight.
      const busy = new Set([...this.#opened.values()].map((o) => o.client));
      const idle = [...this.#upstreams].find(([, u]) => !busy.has(u.client));
      if (idle === undefined) {
        throw new Error(`all ${this.#maxClients} upstream clients have connections open`);
      }
      this.#upstreams.delete(idle[0]);
      this.#byKey.delete(idle[1].key);
      idle[1].client.close();
    }
    const key = crypto.randomUUID();
    const client = Deno.createHttpClient({
      caCerts: this.#extraCa,
      proxy: {
        url: `http://127.0.0.1:${(this.#connectListener!.addr as Deno.NetAddr).port}`,
        basicAuth: { username: key, password: "x" },
      },
    });
    const made = { client, key, ip };
    this.#upstreams.set(at, made);
    this.#byKey.set(key, made);
    return made;
  }

  #terminator(name: string): Promise<Terminator> {
    const known = this.#terminators.get(name);
    if (known !== undefined) {
      // Most recently used last: the first is the one to close.
      this.#terminators.delete(name);
      this.#terminators.set(name, known);
      return known;
    }
    if (this.#terminators.size >= this.#maxTerminators) {
      const busy = new Set([...this.#opened.values()].map((o) => o.name));
      const idle = [...this.#terminators.keys()].find((n) => !busy.has(n));
      if (idle === undefined) {
        return Promise.reject(
          new Error(`all ${this.#maxTerminators} opened names have connections open`),
        );
      }
      const t = this.#terminators.get(idle)!;
      this.#terminators.delete(idle);
      t.then((x) => x.server.shutdown(), () => {});
    }
    const made = (async () => {
      const { cert, key } = await this.#ca.leaf(name);
      let port = 0;
      const server = Deno.serve({
        hostname: "127.0.0.1",
        port: 0,
        cert,
        key,
        onListen: (addr) => port = addr.port,
        onError: () => new Response("dormice egress: the request failed\n", { status: 502 }),
      }, (req, info) => this.#forward(req, (info.remoteAddr as Deno.NetAddr).port));
      return { server, port: port || (server.addr as Deno.NetAddr).port };
    })();
    this.#terminators.set(name, made);
    made.catch(() => this.#terminators.delete(name));
    return made;
  }

  /** One request of an opened connection: the transform's headers added, sent on over HTTPS. */
  async #forward(req: Request, fromPort: number): Promise<Response> {
    const opened = this.#opened.get(fromPort);
    const sandbox = opened && this.#byId.get(opened.id);
    if (opened === undefined || sandbox === undefined) {
      return new Response("dormice egress: this connection is no longer the sandbox's\n", {
        status: 403,
      });
    }
    if (!allows(sandbox.rules, opened.name, opened.ip)) {
      // The rules changed since the connection was opened: the name is no longer the sandbox's.
      return new Response(
        `dormice egress: the sandbox's egress rules deny ${opened.name} now (changed since ` +
          "this connection was opened)\n",
        { status: 403, headers: { "content-type": "text/plain", connection: "close" } },
      );
    }
    if (req.headers.has("upgrade")) {
      // fetch cannot carry an upgraded connection, so the headers could not go on it.
      return new Response(
        `dormice egress: ${opened.name} has header transforms, and an upgraded connection ` +
          `(Upgrade: ${req.headers.get("upgrade")!.slice(0, 40)}, e.g. a WebSocket) to a domain ` +
          "with header transforms is not served: use plain HTTPS requests to it, or drop its " +
          "transform rule to reach it without added headers\n",
        { status: 501, headers: { "content-type": "text/plain" } },
      );
    }
    const headers = new Headers(req.headers);
    for (const t of transformsFor(sandbox.rules.transforms, opened.name) ?? []) {
      for (const [h, v] of Object.entries(t.headers ?? {})) headers.set(h, v);
    }
    // Uncompressed: fetch undoes a gzip or br it asked for (even when the sandbox's own header
    // asked) yet keeps the upstream's Content-Encoding and Content-Length, which would then lie
    // to the sandbox. With identity the bytes and their headers pass as the upstream sent them.
    headers.set("accept-encoding", "identity");
    const url = new URL(req.url);
    // In flight until its answer's body ends: counted against the sandbox's share (an HTTP/2
    // connection carries many at once, each an upstream connection of a shared pool).
    const inFlight = new AbortController();
    const admitted = this.#requests.admit(opened.id, inFlight, (other) => {
      other.abort(new Error("closed to give another sandbox its share of the egress proxy"));
    });
    if (!admitted) {
      return new Response(
        `dormice egress: this sandbox has ${this.#requestsPerSandbox} or more requests in flight ` +
          "to domains with header transforms, as many as it may have: wait for some to end\n",
        { status: 503, headers: { "content-type": "text/plain", "retry-after": "1" } },
      );
    }
    this.#inFlight.add(inFlight);
    const done = () => {
      this.#requests.release(opened.id, inFlight);
      this.#inFlight.delete(inFlight);
    };
    try {
      const res = await this.#fetch(`https://${opened.name}${url.pathname}${url.search}`, {
        method: req.method,
        headers,
        body: req.body,
        redirect: "manual",
        client: opened.client,
        signal: inFlight.signal,
      });
      if (res.body === null) {
        done();
        return new Response(null, { status: res.status, headers: res.headers });
      }
      const reader = res.body.getReader();
      const body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          try {
            const { done: end, value } = await reader.read();
            if (end) {
              done();
              controller.close();
            } else controller.enqueue(value);
          } catch (error) {
            done();
            controller.error(error);
          }
        },
        cancel(reason) {
          done();
          return reader.cancel(reason);
        },
      });
      return new Response(body, { status: res.status, headers: res.headers });
    } catch (error) {
      done();
      const why = error instanceof Error ? error.message : String(error);
      return new Response(`dormice egress: ${opened.name} could not be reached: ${why}\n`, {
        status: 502,
      });
    }
  }

  /** A CONNECT from the proxy's own HTTPS client: to the address the judged name resolved to. */
  async #tunnel(conn: Deno.Conn): Promise<void> {
    const head = await this.#head(conn, (data) => {
      const text = new TextDecoder().decode(data);
      return text.includes("\r\n\r\n") ? text : null;
    });
    if (head === null) return;
    const auth = /\r\nproxy-authorization:\s*basic\s+(\S+)/i.exec(head.value)?.[1];
    let user = "";
    try {
      user = atob(auth ?? "").split(":")[0];
    } catch { /* not base64: refused below */ }
    const pinned = this.#byKey.get(user);
    if (pinned === undefined) {
      await writeAll(conn, new TextEncoder().encode("HTTP/1.1 407 Unknown\r\n\r\n")).catch(
        () => {},
      );
      return;
    }
    let upstream: Deno.TcpConn;
    try {
      upstream = await connectWithin(pinned.ip, 443);
    } catch {
      await writeAll(conn, new TextEncoder().encode("HTTP/1.1 502 Unreachable\r\n\r\n")).catch(
        () => {},
      );
      return;
    }
    await writeAll(conn, new TextEncoder().encode("HTTP/1.1 200 Connection established\r\n\r\n"));
    await splice(conn, upstream);
  }
}
