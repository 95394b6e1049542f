import assert from "node:assert/strict";
import { EgressProxy } from "./_egress_proxy.ts";
import { hostOf, judgeName, sniOf } from "./_egress_names.ts";
import type { EgressCa } from "./_egress_ca.ts";

/** The first bytes a TLS client sends for `name`: a real ClientHello, captured on loopback. */
async function clientHello(name: string): Promise<Uint8Array> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  const client = await Deno.startTls(await Deno.connect({ hostname: "127.0.0.1", port }), {
    hostname: name,
  });
  const server = await listener.accept();
  const buf = new Uint8Array(16 * 1024);
  let have = 0;
  try {
    client.handshake().catch(() => {});
    while (have === 0 || sniOf(buf.subarray(0, have)) === null) {
      const n = await server.read(buf.subarray(have));
      if (n === null) break;
      have += n;
    }
    return buf.slice(0, have);
  } finally {
    server.close();
    listener.close();
    try {
      client.close();
    } catch { /* closed by the failed handshake */ }
  }
}

Deno.test("sniOf() reads the server name of a real ClientHello, and waits for a whole record", async () => {
  const hello = await clientHello("api.allowed.test");
  assert.equal(sniOf(hello), "api.allowed.test");
  assert.equal(sniOf(hello.subarray(0, 3)), null);
  assert.equal(sniOf(hello.subarray(0, hello.length - 1)), null);
  assert.equal(sniOf(new TextEncoder().encode("GET / HTTP/1.1\r\n")), undefined);
});

Deno.test("hostOf() reads the Host of a whole request head, without its port", () => {
  const enc = (s: string) => new TextEncoder().encode(s);
  assert.equal(
    hostOf(enc("GET / HTTP/1.1\r\nHost: Allowed.test:80\r\nA: b\r\n\r\n")),
    "Allowed.test",
  );
  assert.equal(hostOf(enc("GET / HTTP/1.1\r\nHost: a.test\r\n")), null);
  assert.equal(hostOf(enc("GET / HTTP/1.0\r\n\r\n")), undefined);
  assert.equal(hostOf(enc("\x00\x01\x02 not http at all")), undefined);
});

Deno.test("judgeName(): an allowed domain wins over a denied one, the rest is left to the address", () => {
  const rules = {
    allowOut: [],
    denyOut: ["0.0.0.0/0"],
    allowDomains: ["api.example.com"],
    denyDomains: ["*.example.com"],
  };
  assert.equal(judgeName(rules, "api.example.com"), "allow");
  assert.equal(judgeName(rules, "www.example.com"), "deny");
  assert.equal(judgeName(rules, "example.com"), "address");
  assert.equal(judgeName(rules, "other.test"), "address");
});

/** An HTTP/1.1 request through `proxy` (port) as the sandbox at 127.0.0.1: the answer's text. */
async function ask(port: number, host: string): Promise<string> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(new TextEncoder().encode(`GET / HTTP/1.1\r\nHost: ${host}\r\n\r\n`));
    return await new Response(conn.readable).text();
  } catch {
    return "";
  }
}

Deno.test({
  name: "EgressProxy refuses denied names, this host's addresses whatever the rules, and strangers",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const proxy = new EgressProxy({
    ca: null as unknown as EgressCa,
    hosts: new Map([["looped.test", "127.0.0.9"]]),
    log: () => {},
  });
  try {
    const port = proxy.start("127.0.0.1");
    // A stranger (no sandbox at its address) gets nothing at all.
    assert.equal(await ask(port, "allowed.test"), "");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      allowDomains: ["looped.test"],
      denyDomains: ["*.denied.test"],
    });
    assert.match(await ask(port, "a.denied.test"), /^HTTP\/1\.1 403 .*deny a\.denied\.test/s);
    // Allowed by name, and still refused: it resolves to this host's loopback.
    assert.match(await ask(port, "looped.test"), /403 .*resolves to 127\.0\.0\.9, an address of/s);
    assert.match(await ask(port, "127.0.0.1"), /403 .*an address of this host/s);
    // Forgotten: a stranger again.
    proxy.forget("sb1");
    assert.equal(await ask(port, "a.denied.test"), "");
  } finally {
    await proxy.close();
  }
});

Deno.test({
  name: "EgressProxy holds at most 512 connections of one sandbox at once",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const proxy = new EgressProxy({ ca: null as unknown as EgressCa, log: () => {} });
  const open: Deno.Conn[] = [];
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", { allowOut: [], denyOut: [], allowDomains: ["a.test"] });
    for (let i = 0; i < 512; i++) open.push(await Deno.connect({ hostname: "127.0.0.1", port }));
    // Each of those waits for its request head; one more is closed unanswered at once.
    const extra = await Deno.connect({ hostname: "127.0.0.1", port });
    // (Within 2 s: a held one is closed only by the 10 s head timeout.)
    const closed = extra.read(new Uint8Array(1));
    const late = new Promise<"held">((r) => setTimeout(() => r("held"), 2000));
    assert.equal(await Promise.race([closed, late]), null);
    extra.close();
    // One closes, and a new one is held again (not closed).
    open.pop()!.close();
    await new Promise((r) => setTimeout(r, 50));
    const again = await Deno.connect({ hostname: "127.0.0.1", port });
    open.push(again);
    const read = again.read(new Uint8Array(1));
    const timer = new Promise<"held">((r) => setTimeout(() => r("held"), 200));
    assert.equal(await Promise.race([read, timer]), "held");
  } finally {
    for (const c of open) c.close();
    await proxy.close();
  }
});

Deno.test({
  name:
    "EgressProxy refuses every address on the node's sandbox bridges (dm-*), by name or literal",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  // The node names its bridges dm-<hash>-e / dm-<hash>-i: another sandbox sits at 10.99.0.5.
  const interfaces = (): Deno.NetworkInterfaceInfo[] => [
    {
      family: "IPv4",
      name: "lo",
      address: "127.0.0.1",
      netmask: "255.0.0.0",
      scopeid: null,
      cidr: "127.0.0.1/8",
      mac: "00:00:00:00:00:00",
    },
    {
      family: "IPv4",
      name: "dm-0123456789-e",
      address: "10.99.0.1",
      netmask: "255.255.0.0",
      scopeid: null,
      cidr: "10.99.0.1/16",
      mac: "02:42:00:00:00:01",
    },
    {
      family: "IPv4",
      name: "dm-0123456789-i",
      address: "10.98.0.1",
      netmask: "255.255.0.0",
      scopeid: null,
      cidr: "10.98.0.1/16",
      mac: "02:42:00:00:00:02",
    },
  ];
  const proxy = new EgressProxy({
    ca: null as unknown as EgressCa,
    hosts: new Map([["peer.test", "10.99.0.5"]]),
    log: () => {},
    interfaces,
  });
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", { allowOut: [], denyOut: [], allowDomains: ["peer.test"] });
    // Allowed by name, resolving to a neighbour on the egress bridge: refused, not connected.
    assert.match(
      await ask(port, "peer.test"),
      /403 .*resolves to 10\.99\.0\.5, an address of this host or its sandboxes/s,
    );
    // The same by address (no rule names it), and a sandbox on the internal bridge.
    assert.match(await ask(port, "10.99.0.7"), /403 .*an address of this host or its sandboxes/s);
    assert.match(await ask(port, "10.98.3.4"), /403 .*an address of this host or its sandboxes/s);
  } finally {
    await proxy.close();
  }
});

const hasOpenssl = await new Deno.Command("openssl", { args: ["version"], stdout: "null" })
  .output().then((o) => o.success, () => false);
if (!hasOpenssl) console.log("egress proxy transform tests skipped: openssl is not installed");

/** The answer head and body `request` gets over TLS for `name` through the proxy at `port`. */
async function askTls(port: number, name: string, caPem: string, request: string) {
  const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
  const tls = await Deno.startTls(tcp, { hostname: name, caCerts: [caPem] });
  try {
    await tls.write(new TextEncoder().encode(request));
    const buf = new Uint8Array(4096);
    let text = "";
    const until = Date.now() + 15_000;
    while (!/\r\n\r\n[\s\S]*\n/.test(text) && Date.now() < until) {
      const n = await tls.read(buf);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
    return text;
  } finally {
    tls.close();
  }
}

Deno.test({
  name: "EgressProxy refuses an upgrade (WebSocket) to a domain with transforms with a clear 501",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-proxy-test-" });
  const { EgressCa } = await import("./_egress_ca.ts");
  const ca = await EgressCa.load(null, dir);
  // 198.18.0.9: a benchmark address nothing answers at; the refusal comes before any connect.
  const proxy = new EgressProxy({ ca, hosts: new Map([["ws.test", "198.18.0.9"]]), log: () => {} });
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      transforms: { "ws.test": [{ headers: { "X-Key": "k" } }] },
    });
    const answer = await askTls(
      port,
      "ws.test",
      ca.certPem,
      "GET /chat HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    assert.match(answer, /^HTTP\/1\.1 501 /);
    assert.match(answer, /ws\.test has header transforms, and an upgraded connection/);
    assert.doesNotMatch(answer, /X-Key|: k\r/);
  } finally {
    await proxy.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "EgressProxy answers a request head past its bound with a 431 naming the bound",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const proxy = new EgressProxy({ ca: null as unknown as EgressCa, log: () => {} });
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", { allowOut: [], denyOut: [], allowDomains: ["a.test"] });
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    // Exactly the bound, unfinished: nothing is left unread when the proxy closes (which would
    // reset the connection under the answer).
    const start = "GET / HTTP/1.1\r\nHost: a.test\r\nX-Pad: ";
    const head = start + "p".repeat(16 * 1024 + 5 - start.length);
    conn.write(new TextEncoder().encode(head)).catch(() => {});
    const answer = await new Response(conn.readable).text().catch(() => "");
    assert.match(answer, /^HTTP\/1\.1 431 /);
    assert.match(answer, /larger than 16384 bytes/);
  } finally {
    await proxy.close();
  }
});

/** One request on an open TLS connection: the answer's status line, or `null` when cut. */
async function statusOn(tls: Deno.Conn, name: string): Promise<string | null> {
  try {
    await tls.write(new TextEncoder().encode(`GET / HTTP/1.1\r\nHost: ${name}\r\n\r\n`));
    const buf = new Uint8Array(4096);
    let text = "";
    for (;;) {
      const end = text.indexOf("\r\n\r\n");
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(text)?.[1] ?? "0");
      if (end >= 0 && text.length >= end + 4 + length) return text.split("\r\n")[0];
      const n = await tls.read(buf);
      if (n === null) return null;
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
  } catch {
    return null;
  }
}

Deno.test({
  name: "EgressProxy never closes a TLS terminator another connection is open through",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-proxy-test-" });
  const { EgressCa } = await import("./_egress_ca.ts");
  const ca = await EgressCa.load(null, dir);
  const names = ["n1.t.test", "n2.t.test", "n3.t.test"];
  const proxy = new EgressProxy({
    ca,
    hosts: new Map(names.map((n) => [n, "198.18.0.9"])),
    log: () => {},
    maxTerminators: 2,
  });
  const open: Deno.Conn[] = [];
  const connect = async (name: string) => {
    const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
    const tls = await Deno.startTls(tcp, { hostname: name, caCerts: [ca.certPem] });
    open.push(tls);
    return tls;
  };
  let port = 0;
  try {
    port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      transforms: { "*.t.test": [{ headers: { "X-Key": "k" } }] },
    });
    // Two names opened, a connection open through each (upstream unreachable: a 502 each).
    const one = await connect(names[0]);
    assert.match((await statusOn(one, names[0]))!, /^HTTP\/1\.1 502/);
    const two = await connect(names[1]);
    assert.match((await statusOn(two, names[1]))!, /^HTTP\/1\.1 502/);
    // A third name while both are in use: refused, and neither is cut.
    const three = await connect(names[2]).then((c) => statusOn(c, names[2]), () => null);
    assert.equal(three, null);
    assert.match((await statusOn(one, names[0]))!, /^HTTP\/1\.1 502/, "n1's connection is cut");
    assert.match((await statusOn(two, names[1]))!, /^HTTP\/1\.1 502/, "n2's connection is cut");
    // Once n2's connection is closed, n3 gets the place of n2 (not of n1, in use).
    two.close();
    let again: string | null = null;
    for (let i = 0; i < 200 && again === null; i++) {
      again = await connect(names[2]).then((c) => statusOn(c, names[2]), () => null);
    }
    assert.match(again!, /^HTTP\/1\.1 502/);
    assert.match((await statusOn(one, names[0]))!, /^HTTP\/1\.1 502/, "n1's connection is cut");
  } finally {
    for (const c of open) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    await proxy.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "EgressProxy never closes an upstream client an opened connection goes on with",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-proxy-test-" });
  const { EgressCa } = await import("./_egress_ca.ts");
  const ca = await EgressCa.load(null, dir);
  const names = ["m1.t.test", "m2.t.test"];
  const proxy = new EgressProxy({
    ca,
    hosts: new Map(names.map((n) => [n, "198.18.0.9"])),
    log: () => {},
    maxClients: 1,
  });
  const open: Deno.Conn[] = [];
  let port = 0;
  const connect = async (name: string) => {
    const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
    const tls = await Deno.startTls(tcp, { hostname: name, caCerts: [ca.certPem] });
    open.push(tls);
    return tls;
  };
  try {
    port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      transforms: { "*.t.test": [{ headers: { "X-Key": "k" } }] },
    });
    const one = await connect(names[0]);
    assert.match((await statusOn(one, names[0]))!, /^HTTP\/1\.1 502/);
    // The one client is in use: a second name is refused rather than closing it.
    assert.equal(await connect(names[1]).then((c) => statusOn(c, names[1]), () => null), null);
    assert.match((await statusOn(one, names[0]))!, /^HTTP\/1\.1 502/);
    // Once that connection is closed, the second name gets its client.
    one.close();
    let again: string | null = null;
    for (let i = 0; i < 200 && again === null; i++) {
      again = await connect(names[1]).then((c) => statusOn(c, names[1]), () => null);
    }
    assert.match(again!, /^HTTP\/1\.1 502/);
  } finally {
    for (const c of open) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    await proxy.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "EgressProxy resolves at most 16 names of one sandbox at once; the next is refused at once",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  // A resolver whose answers never come (a name server that never answers), counting calls.
  let calls = 0;
  const reached: ((n: number) => void)[] = [];
  const callNumber = (n: number) => new Promise<number>((r) => reached[n] = r);
  const sixteenth = callNumber(16);
  const seventeenth = callNumber(17);
  const proxy = new EgressProxy({
    ca: null as unknown as EgressCa,
    log: () => {},
    lookup: () => {
      calls++;
      reached[calls]?.(calls);
      return new Promise<string>(() => {});
    },
  });
  const conns: Deno.Conn[] = [];
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", { allowOut: [], denyOut: [], allowDomains: ["*.slow.test"] });
    for (let i = 0; i < 16; i++) {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port });
      conns.push(conn);
      await conn.write(new TextEncoder().encode(`GET / HTTP/1.1\r\nHost: s${i}.slow.test\r\n\r\n`));
    }
    await sixteenth;
    const answer = ask(port, "s16.slow.test");
    const first = await Promise.race([answer, seventeenth.then(() => "looked up as well")]);
    assert.match(first, /^HTTP\/1\.1 403 .*resolving 16 names for this sandbox at once/s);
    assert.equal(calls, 16);
  } finally {
    for (const c of conns) c.close();
    await proxy.close();
  }
});

Deno.test({
  name: "EgressProxy holds at most its cap of one sandbox's requests in flight; the next is a 503",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-proxy-test-" });
  const { EgressCa } = await import("./_egress_ca.ts");
  const ca = await EgressCa.load(null, dir);
  // An upstream that answers nothing until the proxy gives up on the request.
  let calls = 0;
  let third: () => void = () => {};
  const thirdCall = new Promise<string>((r) => third = () => r("sent on as well"));
  const twoCalls = Promise.withResolvers<void>();
  const proxy = new EgressProxy({
    ca,
    hosts: new Map([["h.t.test", "198.18.0.9"]]),
    log: () => {},
    maxRequestsPerSandbox: 2,
    fetch: (_url, init) => {
      calls++;
      if (calls === 2) twoCalls.resolve();
      if (calls === 3) third();
      return new Promise<Response>((_, reject) => {
        init?.signal?.addEventListener("abort", () => reject(init.signal!.reason));
      });
    },
  });
  const open: Deno.Conn[] = [];
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      transforms: { "h.t.test": [{ headers: { "X-Key": "k" } }] },
    });
    const request = new TextEncoder().encode("GET / HTTP/1.1\r\nHost: h.t.test\r\n\r\n");
    for (let i = 0; i < 3; i++) {
      const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
      open.push(await Deno.startTls(tcp, { hostname: "h.t.test", caCerts: [ca.certPem] }));
    }
    await open[0].write(request);
    await open[1].write(request);
    await twoCalls.promise;
    const answer = statusOn(open[2], "h.t.test");
    assert.match(
      await Promise.race([answer.then((a) => a ?? "cut"), thirdCall]),
      /^HTTP\/1\.1 503 /,
    );
    assert.equal(calls, 2);
  } finally {
    for (const c of open) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    await proxy.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "EgressProxy's TLS terminators accept with no-delay (a head never waits for an ACK)",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-proxy-test-" });
  const { EgressCa } = await import("./_egress_ca.ts");
  const { Socket } = await import("node:net");
  const ca = await EgressCa.load(null, dir);
  // No socket option is readable back, so the call itself is watched: the terminator's are the
  // only node sockets in this process.
  const original = Socket.prototype.setNoDelay;
  const calls: (boolean | undefined)[] = [];
  Socket.prototype.setNoDelay = function (this: InstanceType<typeof Socket>, noDelay?: boolean) {
    calls.push(noDelay);
    return original.call(this, noDelay);
  };
  const proxy = new EgressProxy({
    ca,
    hosts: new Map([["nd.test", "198.18.0.9"]]),
    log: () => {},
    fetch: () => Promise.resolve(new Response("upstream")),
  });
  const open: Deno.Conn[] = [];
  try {
    const port = proxy.start("127.0.0.1");
    proxy.set("127.0.0.1", "sb1", {
      allowOut: [],
      denyOut: [],
      transforms: { "nd.test": [{ headers: { "X-Key": "k" } }] },
    });
    for (let i = 0; i < 2; i++) {
      const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
      const tls = await Deno.startTls(tcp, { hostname: "nd.test", caCerts: [ca.certPem] });
      open.push(tls);
      assert.match((await statusOn(tls, "nd.test"))!, /^HTTP\/1\.1 200/);
    }
    assert.deepEqual(calls, [true, true], "one setNoDelay(true) per accepted connection");
  } finally {
    Socket.prototype.setNoDelay = original;
    for (const c of open) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    await proxy.close();
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Listeners that accept nothing, on ports counted up from 50000: which are open is known at
 * once, where a real one's close completes only once its pending accept is cancelled.
 */
function fakeListeners() {
  const open = new Set<number>();
  let next = 50_000;
  const listen = (hostname: string) => {
    const port = next++;
    open.add(port);
    let stop = () => {};
    const stopped = new Promise<void>((resolve) => stop = resolve);
    return {
      addr: { transport: "tcp", hostname, port },
      close() {
        if (!open.delete(port)) throw new Deno.errors.BadResource("closed already");
        stop();
      },
      [Symbol.asyncIterator]: () => ({
        next: () => stopped.then(() => ({ done: true, value: undefined })),
      }),
    } as unknown as Deno.TcpListener;
  };
  return { open, listen };
}

Deno.test({
  name:
    "EgressProxy closes a port's listener once no sandbox names it: 64 used and let go, a 65th opens",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const { open, listen } = fakeListeners();
  const proxy = new EgressProxy({ ca: null as unknown as EgressCa, log: () => {}, listen });
  const iface = "dm-test-e";
  try {
    const opened: number[] = [];
    for (let i = 0; i < 64; i++) {
      const got = proxy.hold(`sb${i}`, "127.0.0.1", [10_000 + i], iface);
      opened.push(got.get(10_000 + i)!);
    }
    assert.equal(proxy.portListeners, 64);
    assert.equal(new Set(opened).size, 64);
    // A 65th port while all 64 are named: refused, and the refused hold keeps nothing open.
    assert.throws(
      () => proxy.hold("sb64", "127.0.0.1", [8443, 20_000], iface),
      /listens for 64 ports other than 80 and 443 already .*until no sandbox's rules name it/,
    );
    assert.equal(proxy.portListeners, 64);
    // Half the sandboxes are destroyed, the other half drop their key (an updateNetwork).
    const released = [];
    for (let i = 0; i < 64; i++) {
      if (i % 2 === 0) released.push(...proxy.forget(`sb${i}`));
      else {
        assert.deepEqual(proxy.hold(`sb${i}`, "127.0.0.1", [], iface), new Map());
        released.push(...proxy.release(`sb${i}`));
      }
    }
    assert.deepEqual(
      released.map((r) => r.listener).sort(),
      [...opened].sort(),
    );
    assert.ok(released.every((r) => r.iface === iface));
    assert.equal(proxy.portListeners, 0);
    assert.deepEqual(open, new Set());
    // The 65th port over the node's life opens.
    const got = proxy.hold("sb64", "127.0.0.1", [20_000], iface);
    assert.equal(proxy.portListeners, 1);
    assert.deepEqual(open, new Set([got.get(20_000)]));
  } finally {
    await proxy.close();
  }
});

Deno.test({
  name: "EgressProxy keeps a port's listener open while any sandbox's current rules name it",
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const { open, listen } = fakeListeners();
  const proxy = new EgressProxy({ ca: null as unknown as EgressCa, log: () => {}, listen });
  const iface = "dm-test-e";
  try {
    const l8443 = proxy.hold("a", "127.0.0.1", [8443], iface).get(8443)!;
    // b names the same port: the same listener, one more holder.
    assert.equal(proxy.hold("b", "127.0.0.1", [8443], iface).get(8443), l8443);
    assert.equal(proxy.portListeners, 1);
    // a's rules move from 8443 to 9443: b still names 8443, so it stays open.
    const l9443 = proxy.hold("a", "127.0.0.1", [9443], iface).get(9443)!;
    assert.deepEqual(proxy.release("a"), []);
    assert.equal(open.has(l8443), true);
    // b's update keeps 8443 and adds 7443: held across the update (counted before released).
    const both = proxy.hold("b", "127.0.0.1", [8443, 7443], iface);
    assert.equal(both.get(8443), l8443);
    assert.deepEqual(proxy.release("b"), []);
    assert.equal(open.has(l8443), true);
    // The port moves from b to a: a holds it before b lets go, so it is never closed.
    assert.equal(proxy.hold("a", "127.0.0.1", [9443, 8443], iface).get(8443), l8443);
    assert.deepEqual(proxy.release("a"), []);
    assert.equal(proxy.hold("b", "127.0.0.1", [7443], iface).get(8443), undefined);
    assert.deepEqual(proxy.release("b"), []);
    assert.equal(open.has(l8443), true);
    // a destroyed: 8443 and 9443 close; b's 7443 stays.
    assert.deepEqual(
      proxy.forget("a").map((r) => r.listener).sort(),
      [l8443, l9443].sort(),
    );
    assert.equal(open.has(l8443), false);
    assert.equal(open.has(both.get(7443)!), true);
    assert.equal(proxy.portListeners, 1);
  } finally {
    await proxy.close();
  }
});
