import assert from "node:assert/strict";
import type { EgressRules } from "../../../shared/egress_rules.ts";
import { EgressCa } from "./_egress_ca.ts";
import { sniOf } from "./_egress_names.ts";
import { MAX_REQUEST_HEAD, TransformPath } from "./_egress_transform.ts";
import { readHead } from "./_egress_wire.ts";

const hasOpenssl = await new Deno.Command("openssl", { args: ["version"], stdout: "null" })
  .output().then((o) => o.success, () => false);
if (!hasOpenssl) console.log("transform path tests skipped: openssl is not installed");

const withTransform: EgressRules = {
  allowOut: [],
  denyOut: [],
  allowDomains: ["up.test"],
  transforms: { "up.test": [{ headers: { "X-Key": "secret" } }] },
};

/**
 * An upstream for `up.test` (a certificate its own CA signs) that echoes the header and path it
 * got, and a TransformPath in front of it trusting `extraCaCerts`, behind a listener that reads
 * the SNI as the proxy does; `rules` is read at each request.
 */
async function fixture(dir: string, trustUpstream: boolean, rules: { now: EgressRules }) {
  const upCa = await EgressCa.load(null, `${dir}/up`);
  const fleet = await EgressCa.load(null, `${dir}/fleet`);
  const leaf = await upCa.leaf("up.test");
  const upstream = Deno.serve(
    { hostname: "127.0.0.1", port: 0, cert: leaf.cert, key: leaf.key, onListen() {} },
    (req) => new Response(`${req.headers.get("x-key")} ${new URL(req.url).pathname}`),
  );
  const path = new TransformPath({
    ca: fleet,
    extraCaCerts: trustUpstream ? [upCa.certPem] : [],
    log: () => {},
    maxTerminators: 4,
    maxClients: 4,
    maxRequestsPerSandbox: 8,
    rulesOf: () => rules.now,
    teamOf: () => "team",
    upstreamPort: upstream.addr.port,
  });
  const front = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const serving = (async () => {
    for await (const conn of front) {
      (async () => {
        const hello = await readHead(conn, (d) => sniOf(d) ?? null);
        if (hello !== null) await path.open(conn, "sb1", "up.test", "127.0.0.1", hello.data);
      })().catch(() => {}).finally(() => {
        try {
          conn.close();
        } catch { /* closed already */ }
      });
    }
  })().catch(() => {});
  return {
    port: (front.addr as Deno.NetAddr).port,
    fleetPem: fleet.certPem,
    async close() {
      front.close();
      await serving;
      await path.close();
      await upstream.shutdown();
    },
  };
}

/** One request on `tls`: the answer's status line and body (sized answers only). */
async function exchange(tls: Deno.Conn, target: string, more = ""): Promise<string> {
  const head = `GET ${target} HTTP/1.1\r\nHost: up.test\r\n${more}\r\n`;
  const bytes = new TextEncoder().encode(head);
  try {
    for (let at = 0; at < bytes.length;) at += await tls.write(bytes.subarray(at));
  } catch { /* answered and closed before the whole head went: read the answer */ }
  const buf = new Uint8Array(4096);
  let text = "";
  for (;;) {
    const end = text.indexOf("\r\n\r\n");
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(text)?.[1] ?? "0");
    if (end >= 0 && text.length >= end + 4 + length) {
      return `${text.split("\r\n")[0]} | ${text.slice(end + 4)}`;
    }
    const n = await tls.read(buf);
    if (n === null) return `${text} | cut`;
    text += new TextDecoder().decode(buf.subarray(0, n));
  }
}

Deno.test({
  name:
    "TransformPath adds the headers, verifies the upstream by the extra CA, re-judges each request",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-transform-test-" });
  const rules = { now: withTransform };
  const f = await fixture(dir, true, rules);
  let tls: Deno.TlsConn | undefined;
  try {
    const tcp = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
    tls = await Deno.startTls(tcp, { hostname: "up.test", caCerts: [f.fleetPem] });
    assert.equal(await exchange(tls, "/a?b=1"), "HTTP/1.1 200 OK | secret /a");
    // The same connection again: kept alive, the header added again.
    assert.equal(await exchange(tls, "/c"), "HTTP/1.1 200 OK | secret /c");
    // A head past the cap: a 431 naming it (the connection then closes: a new one goes on).
    const pad = "x".repeat(MAX_REQUEST_HEAD);
    assert.match(
      await exchange(tls, `/e`, `X-Pad: ${pad}\r\n`),
      /^HTTP\/1\.1 431 .*longer than 65536/s,
    );
    tls.close();
    tls = await Deno.startTls(await Deno.connect({ hostname: "127.0.0.1", port: f.port }), {
      hostname: "up.test",
      caCerts: [f.fleetPem],
    });
    // The rules replaced while the connection is open: its next request is judged by them.
    rules.now = { allowOut: [], denyOut: ["0.0.0.0/0"], denyDomains: ["up.test"] };
    assert.match(await exchange(tls, "/d"), /^HTTP\/1\.1 403 .*deny up\.test now/s);
  } finally {
    tls?.close();
    await f.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name:
    "TransformPath refuses an upstream whose certificate no trusted CA signed: a 502, no header sent",
  ignore: !hasOpenssl,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-transform-test-" });
  const f = await fixture(dir, false, { now: withTransform });
  let tls: Deno.TlsConn | undefined;
  try {
    const tcp = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
    tls = await Deno.startTls(tcp, { hostname: "up.test", caCerts: [f.fleetPem] });
    const answer = await exchange(tls, "/a");
    assert.match(answer, /^HTTP\/1\.1 502 .*up\.test could not be reached/s);
    assert.match(answer, /certificate|UnknownIssuer/i);
    assert.doesNotMatch(answer, /secret/);
  } finally {
    tls?.close();
    await f.close();
    await Deno.remove(dir, { recursive: true });
  }
});
