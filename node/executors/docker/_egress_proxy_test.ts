import assert from "node:assert/strict";
import { hostOf, judgeName, sniOf } from "./_egress_proxy.ts";

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
