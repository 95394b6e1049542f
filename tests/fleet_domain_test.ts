/**
 * `deno task fleet --domain=dormice.test`: the task itself (tests/_fleet_task.ts) with
 * the fake executor, on a free high port so it needs neither root nor 443. It must make a CA and a wildcard certificate with openssl, serve the sandbox
 * domain over https with them, and print the trust, DNS and `E2B_DOMAIN` lines; a second
 * certificate step reuses both files.
 *
 * Its data goes to a fresh `.dormice/fleet-test-*` (`DORMICE_FLEET_DIR`), never the developer's
 * `.dormice/fleet`, and is removed. Needs openssl: off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import { ensureFleetCertificates } from "../examples/_fleet_tls.ts";
import { startFleetTask } from "./_fleet_task.ts";
import { repoRoot } from "./_processes.ts";
import { opensslMissing } from "../shared/_tls_fixtures_test.ts";

const DOMAIN = "dormice.test";

const missing = await opensslMissing();
const onCi = Deno.env.get("CI") === "true";
if (missing !== null && !onCi) console.log(`fleet domain test skipped: ${missing}`);

/** One TLS handshake with the gateway, verifying its certificate for `name` against `ca`. */
async function handshake(port: number, name: string, ca: string): Promise<Deno.TlsConn> {
  const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
  // startTls takes the TCP connection over: from here only the TLS one is closed.
  const tls = await Deno.startTls(tcp, { hostname: name, caCerts: [ca] });
  try {
    await tls.handshake();
    return tls;
  } catch (error) {
    tls.close();
    throw error;
  }
}

/** A GET with `Host: <name>:<port>` over a connection verified for `name`: status and body. */
async function getAs(
  port: number,
  name: string,
  ca: string,
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; body: string }> {
  const conn = await handshake(port, name, ca);
  try {
    const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
    await conn.write(
      new TextEncoder().encode(
        `GET ${path} HTTP/1.1\r\nHost: ${name}:${port}\r\n${head}Connection: close\r\n\r\n`,
      ),
    );
    let raw = "";
    const deadline = AbortSignal.timeout(10_000);
    for await (const chunk of conn.readable.pipeThrough(new TextDecoderStream())) {
      raw += chunk;
      if (deadline.aborted || raw.length > 1 << 20) break;
    }
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);
    return { status, body: raw.slice(raw.indexOf("\r\n\r\n") + 4) };
  } finally {
    try {
      conn.close();
    } catch { /* closed by the server after Connection: close */ }
  }
}

Deno.test({
  name: "deno task fleet --domain makes a CA and a wildcard certificate and prints E2B_DOMAIN",
  ignore: missing !== null && !onCi,
  // The fleet's children are processes this test stops; their pipes close with them.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (missing !== null) {
    throw new Error(`CI=true, so the fleet domain test must run, but ${missing}`);
  }
  const fleet = startFleetTask({ args: [`--domain=${DOMAIN}`], env: { DORMICE_EXECUTOR: "fake" } });
  const { dataDir } = fleet;
  const port = Number(new URL(fleet.gatewayUrl).port);
  try {
    await fleet.up(60_000);
    const out = fleet.stdout();
    const lines = out.split("\n").map((l) => l.trim());
    const exported = fleet.exported;

    // The port is not 443, so it rides in the domain, and the reason is printed.
    assert.equal(exported("E2B_DOMAIN"), `${DOMAIN}:${port}`, out);
    assert.match(out, /with no port/);
    const key = exported("E2B_API_KEY");
    assert.match(key ?? "", /^e2b_[0-9a-f]+$/, out);
    const caFile = `${repoRoot.replace(/\/$/, "")}/${dataDir}/tls/${DOMAIN}/ca.pem`;
    assert.equal(exported("DENO_CERT"), caFile);
    assert.equal(exported("NODE_EXTRA_CA_CERTS"), caFile);
    assert.ok(lines.includes(`127.0.0.1 api.${DOMAIN}`), out);
    assert.ok(lines.some((l) => l.includes(`address=/${DOMAIN}/127.0.0.1`)), out);
    assert.equal(exported("SSL_CERT_FILE"), caFile);
    // One set of client settings: with E2B_API_URL beside E2B_DOMAIN the SDK takes the URL,
    // where signed file URLs cannot be routed.
    assert.equal(exported("E2B_API_URL"), undefined, out);
    assert.equal(exported("E2B_SANDBOX_URL"), undefined, out);

    // The certificate the gateway serves is valid for both kinds of name the SDK reaches, and
    // only for them.
    const ca = await Deno.readTextFile(caFile);
    (await handshake(port, `api.${DOMAIN}`, ca)).close();
    (await handshake(port, `8000-sbx_ab12.${DOMAIN}`, ca)).close();
    await assert.rejects(handshake(port, `api.other.test`, ca), /not valid for name/);

    // The domain is routed, not just the certificate served: api.<domain> is the control plane
    // at the root, and the nodes checked in over https trusting the same CA.
    const listed = await getAs(port, `api.${DOMAIN}`, ca, "/sandboxes", { "x-api-key": key! });
    assert.equal(listed.status, 200, listed.body);
    assert.deepEqual(JSON.parse(listed.body), []);
    const client = Deno.createHttpClient({ caCerts: [ca] });
    try {
      // Ports take WebSockets in domain mode: an upgrade reaches the routing (a 502 for an
      // unknown sandbox) instead of the guard's 501 for a server started without upgrades.
      const upgrade = await fetch(`https://127.0.0.1:${port}/e2b/envd/`, {
        client,
        headers: {
          connection: "Upgrade",
          upgrade: "websocket",
          "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
          "sec-websocket-version": "13",
          "e2b-sandbox-id": "sbx_nobody",
          "e2b-sandbox-port": "8000",
        },
      });
      assert.notEqual(upgrade.status, 501, await upgrade.text());
      const until = Date.now() + 20_000;
      for (;;) {
        const res = await fetch(`https://127.0.0.1:${port}/healthz`, { client });
        const { nodes } = await res.json();
        if (nodes === 2) break;
        if (Date.now() > until) throw new Error(`${nodes} nodes checked in:\n${fleet.stderr()}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    } finally {
      client.close();
    }

    // A second run keeps the CA (clients trust it once) and the still-valid certificate.
    const before = await Deno.readTextFile(caFile.replace(/ca\.pem$/, "cert.pem"));
    const again = await ensureFleetCertificates(`${repoRoot}${dataDir}/tls`, DOMAIN);
    assert.equal(again.madeCa, false);
    assert.equal(again.madeCert, false);
    assert.equal(await Deno.readTextFile(again.caFile), ca);
    assert.equal(await Deno.readTextFile(again.certFile), before);
  } finally {
    await fleet.stop();
  }
});
