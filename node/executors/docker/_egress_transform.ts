/**
 * The egress proxy's TLS-terminating path, for names with header transforms: a sandbox's
 * connection is handed to the name's terminator (a certificate the fleet egress CA signs,
 * `_egress_ca.ts`), each request gets the headers of the sandbox's current rules and goes on
 * over HTTPS that verifies the upstream, on connections to the address judged (TCP with
 * no-delay, then `Deno.startTls` for the name) sent by the project's HTTP/1.1 client. Terminators, upstream clients and requests in flight are each capped.
 *
 * @module
 */
import { createServer, type Server } from "node:tls";
import type { AddressInfo, Socket } from "node:net";
import { type EgressRules, transformsFor } from "../../../shared/egress_rules.ts";
import { createH1Client, type H1Client, serveH1 } from "../../../shared/http1/mod.ts";
import type { Log } from "../../../shared/log.ts";
import type { EgressCa } from "./_egress_ca.ts";
import { allows } from "./_egress_names.ts";
import { ConnectionShares, MAX_CONNECTIONS } from "./_egress_shares.ts";
import { socketConn } from "./_egress_socket.ts";
import { connectWithin, splice, writeAll } from "./_egress_wire.ts";

/**
 * Most names with a TLS terminator at once; past it the least recently used one no connection
 * is open through is closed (never one in use: that would cut another sandbox's connections).
 */
export const MAX_TERMINATORS = 128;
/**
 * Most upstream HTTPS clients kept (one per name and address); past it the least recently used
 * one no opened connection goes on with is closed.
 */
export const MAX_CLIENTS = 256;
/** The longest request head an opened connection may send (a 431 past it). */
export const MAX_REQUEST_HEAD = 64 * 1024;
/** How long an upstream's TLS handshake may take, ms. */
const HANDSHAKE_TIMEOUT_MS = 10_000;

/** One opened HTTPS connection: whose it is, for which name, and the client it goes on with. */
interface Opened {
  id: string;
  name: string;
  ip: string;
  /** The port the sandbox connected to: the upstream's, and the one its transforms are for. */
  port: number;
  client: H1Client;
}

/**
 * The HTTPS client to one name at one address, kept with its pool of connections: each one TCP
 * to the address judged (never one the name resolves to later), its TLS verified for the name.
 */
interface Upstream {
  client: H1Client;
  ip: string;
}

/**
 * A name's TLS terminator: a `node:tls` listener on loopback (its sockets take `setNoDelay`, which
 * a `Deno.listenTls` connection does not), each connection served HTTP/1.1 by
 * `shared/http1/server.ts`.
 */
interface Terminator {
  server: Server;
  port: number;
  /** Stops listening and closes the connections it serves. */
  close(): void;
}

/** Options of {@linkcode TransformPath}: the proxy's own, and how it reaches the proxy's state. */
export interface TransformPathOptions {
  /** The fleet egress CA, for names with header transforms. */
  ca: EgressCa;
  /** More CA certificates (PEM) upstreams of opened HTTPS may be signed by. */
  extraCaCerts: string[];
  /** Where failures are logged (never a header value). */
  log: Log;
  /** Most names with a TLS terminator at once. */
  maxTerminators: number;
  /** Most upstream HTTPS clients kept, one per name and address. */
  maxClients: number;
  /** Most requests of one sandbox in flight to domains with transforms. */
  maxRequestsPerSandbox: number;
  /** Sends an opened connection's requests on; the upstream's own client when not given. */
  fetch?: typeof fetch;
  /** The current rules of sandbox `id`; `undefined` once the proxy forgot it. */
  rulesOf: (id: string) => EgressRules | undefined;
  /** The key its requests are shared out by between teams (see `ConnectionShares`). */
  teamOf: (id: string) => string;
  /** The port upstreams are reached at: 443 (tests change it). */
  upstreamPort?: number;
}

/** The opened (TLS-terminated) connections of the proxy, their terminators and clients. */
export class TransformPath {
  #ca: EgressCa;
  #extraCa: string[];
  #log: Log;
  #maxTerminators: number;
  #maxClients: number;
  #fetch: typeof fetch | undefined;
  #requestsPerSandbox: number;
  #rulesOf: (id: string) => EgressRules | undefined;
  #upstreamPort: number;
  /**
   * Requests of opened connections in flight, by sandbox id, shared between teams and their
   * sandboxes as connections are.
   */
  #requests: ConnectionShares<AbortController>;
  /** The same requests, for close() to abort (a terminator's shutdown waits for its requests). */
  #inFlight = new Set<AbortController>();
  #opened = new Map<number, Opened>();
  #upstreams = new Map<string, Upstream>();
  #terminators = new Map<string, Promise<Terminator>>();

  constructor(options: TransformPathOptions) {
    this.#ca = options.ca;
    this.#extraCa = options.extraCaCerts;
    this.#log = options.log;
    this.#maxTerminators = options.maxTerminators;
    this.#maxClients = options.maxClients;
    this.#fetch = options.fetch;
    this.#requestsPerSandbox = options.maxRequestsPerSandbox;
    this.#requests = new ConnectionShares(
      MAX_CONNECTIONS,
      options.maxRequestsPerSandbox,
      options.teamOf,
    );
    this.#rulesOf = options.rulesOf;
    this.#upstreamPort = options.upstreamPort ?? 443;
  }

  /** Aborts the requests in flight, closes the terminators and the upstream clients. */
  async close(): Promise<void> {
    for (const request of this.#inFlight) request.abort(new Error("the egress proxy stopped"));
    for (const t of this.#terminators.values()) {
      await t.then((x) => x.close(), () => {});
    }
    this.#terminators.clear();
    for (const u of this.#upstreams.values()) u.client.close();
    this.#upstreams.clear();
  }

  /**
   * Terminates the sandbox's TLS for `name` with the CA's certificate: the connection is handed
   * to the name's terminator, which adds the headers of the sandbox's current rules to every
   * request and sends it on to `ip` at `port` (443 unless the sandbox connected to another).
   */
  async open(
    conn: Deno.Conn,
    id: string,
    name: string,
    ip: string,
    hello: Uint8Array,
    port = 443,
  ) {
    let terminator: Terminator;
    let upstream: Upstream;
    try {
      terminator = await this.#terminator(name);
      upstream = this.#upstream(name, ip, port);
    } catch (error) {
      this.#log("warn", "The egress proxy could not open HTTPS for a domain with transforms", {
        domain: name,
        error,
      });
      return;
    }
    const inner = await Deno.connect({ hostname: "127.0.0.1", port: terminator.port });
    inner.setNoDelay(true);
    const opened: Opened = { id, name, ip, port, client: upstream.client };
    const from = (inner.localAddr as Deno.NetAddr).port;
    this.#opened.set(from, opened);
    try {
      await writeAll(inner, hello);
      await splice(conn, inner);
    } finally {
      this.#opened.delete(from);
    }
  }

  /** The kept HTTPS client to `name` at `ip`:`port`, made on first use. */
  #upstream(name: string, ip: string, port: number): Upstream {
    const at = `${name} ${ip}:${port}`;
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
      idle[1].client.close();
    }
    const caCerts = this.#extraCa;
    // 443 is the upstream port tests may move; a port the sandbox named is used as it is.
    const to = port === 443 ? this.#upstreamPort : port;
    const client = createH1Client({
      // As many as the node's requests in flight: the shares bound them, not this pool.
      maxConnections: MAX_CONNECTIONS,
      connect: (_to, signal) => connectTls(name, ip, to, caCerts, signal),
    });
    const made = { client, ip };
    this.#upstreams.set(at, made);
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
      t.then((x) => x.close(), () => {});
    }
    const made = (async (): Promise<Terminator> => {
      const { cert, key } = await this.#ca.leaf(name);
      const stop = new AbortController();
      // HTTP/1.1 only (the server speaks no HTTP/2): a client offering h2 by ALPN falls back.
      const server = createServer({ cert, key, ALPNProtocols: ["http/1.1"] }, (socket) => {
        serveH1(socketConn(socket), {
          handler: (req, info) => this.#forward(req, info.remoteAddr.port, info.completed),
          onError: () => new Response("dormice egress: the request failed\n", { status: 502 }),
          scheme: "https",
          stop: stop.signal,
          begun() {},
          ended() {},
          maxHeadBytes: MAX_REQUEST_HEAD,
        }).catch(() => {}).finally(() => socket.destroy());
      });
      // No-delay on the TCP socket, before the handshake: a TLS flight or a response head written
      // in pieces must not wait for the ACK of the piece before, which the splice's side of the
      // loopback may delay up to 40 ms.
      server.on("connection", (socket: Socket) => socket.setNoDelay(true));
      // A handshake that fails (a client that does not trust the CA) ends its connection only.
      server.on("tlsClientError", () => {});
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => {
          server.off("error", reject);
          resolve();
        });
      });
      return {
        server,
        port: (server.address() as AddressInfo).port,
        close: () => {
          stop.abort();
          server.close();
        },
      };
    })();
    this.#terminators.set(name, made);
    made.catch(() => this.#terminators.delete(name));
    return made;
  }

  /** One request of an opened connection: the transform's headers added, sent on over HTTPS. */
  async #forward(req: Request, fromPort: number, completed: Promise<void>): Promise<Response> {
    const opened = this.#opened.get(fromPort);
    const rules = opened && this.#rulesOf(opened.id);
    if (opened === undefined || rules === undefined) {
      return new Response("dormice egress: this connection is no longer the sandbox's\n", {
        status: 403,
      });
    }
    if (!allows(rules, opened.name, opened.ip)) {
      // The rules changed since the connection was opened: the name is no longer the sandbox's.
      return new Response(
        `dormice egress: the sandbox's egress rules deny ${opened.name} now (changed since ` +
          "this connection was opened)\n",
        { status: 403, headers: { "content-type": "text/plain", connection: "close" } },
      );
    }
    if (req.headers.has("upgrade")) {
      // The upstream client carries no upgraded connection, so the headers could not go on it.
      return new Response(
        `dormice egress: ${opened.name} has header transforms, and an upgraded connection ` +
          `(Upgrade: ${req.headers.get("upgrade")!.slice(0, 40)}, e.g. a WebSocket) to a domain ` +
          "with header transforms is not served: use plain HTTPS requests to it, or drop its " +
          "transform rule to reach it without added headers\n",
        { status: 501, headers: { "content-type": "text/plain" } },
      );
    }
    const headers = new Headers(req.headers);
    for (const t of transformsFor(rules.transforms, opened.name, opened.port) ?? []) {
      for (const [h, v] of Object.entries(t.headers ?? {})) headers.set(h, v);
    }
    // Uncompressed: the upstream client passes the bytes as sent, but a `fetch` given instead
    // undoes a gzip or br it asked for yet keeps the upstream's Content-Encoding and
    // Content-Length, which would then lie to the sandbox. With identity both agree either way.
    headers.set("accept-encoding", "identity");
    const url = new URL(req.url);
    // In flight until its answer's body ends: counted against the sandbox's share (a sandbox may
    // open many connections at once, each request an upstream connection of a shared pool).
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
    let released = false;
    const done = () => {
      if (released) return;
      released = true;
      this.#requests.release(opened.id, inFlight);
      this.#inFlight.delete(inFlight);
    };
    try {
      const send = this.#fetch ?? opened.client.fetch;
      const authority = opened.port === 443 ? opened.name : `${opened.name}:${opened.port}`;
      const res = await send(`https://${authority}${url.pathname}${url.search}`, {
        method: req.method,
        headers,
        body: req.body,
        redirect: "manual",
        signal: inFlight.signal,
      });
      // The answer goes to the sandbox as it came, its body streamed by the server: the request
      // is in flight until the server has written it all (or failed to).
      completed.then(done, done);
      return res;
    } catch (error) {
      done();
      const why = error instanceof Error ? error.message : String(error);
      return new Response(`dormice egress: ${opened.name} could not be reached: ${why}\n`, {
        status: 502,
      });
    }
  }
}

/**
 * A TLS connection to `name` at `ip:port`: TCP with no-delay (within the connect bound), then the
 * handshake, which verifies the certificate for `name` against Deno's root store plus `caCerts`,
 * within its own bound.
 */
async function connectTls(
  name: string,
  ip: string,
  port: number,
  caCerts: string[],
  signal: AbortSignal | null,
): Promise<Deno.Conn> {
  signal?.throwIfAborted();
  const tcp = await connectWithin(ip, port);
  const tls = await Deno.startTls(tcp, { hostname: name, caCerts });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stop = () => {
    try {
      tls.close();
    } catch { /* closed already */ }
  };
  signal?.addEventListener("abort", stop, { once: true });
  try {
    await Promise.race([
      tls.handshake(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          stop();
          reject(new Error(`no TLS handshake within ${HANDSHAKE_TIMEOUT_MS} ms`));
        }, HANDSHAKE_TIMEOUT_MS);
      }),
    ]);
    return tls;
  } catch (error) {
    stop();
    throw signal?.aborted ? signal.reason : error;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", stop);
  }
}
