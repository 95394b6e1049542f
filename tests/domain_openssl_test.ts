/**
 * Sandbox ids and OpenSSL's certificate check. A gateway serves a sandbox domain over TLS with a
 * wildcard certificate for `*.<domain>`, and one node (fake executor) checks in with it over
 * https. Clients built on OpenSSL (Python's `ssl` and so the Python SDK, httpx, curl, Go, Java)
 * match `*.<domain>` against the left-most label `<port>-<id>` with OpenSSL's own rules, which
 * refuse a `_` in it (verify error 62, hostname mismatch), where Deno's and Node's matchers
 * accept it. So the test talks to the gateway through `openssl s_client -verify_hostname`
 * itself, with `-verify_return_error`: a name OpenSSL refuses gets no HTTP answer at all.
 *
 * Needs openssl: off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import { domainTlsEnv, makeCertificates, opensslMissing } from "../shared/_tls_fixtures_test.ts";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";

const DOMAIN = "dormice-ids.test";

const missing = await opensslMissing();
const onCi = Deno.env.get("CI") === "true";
if (missing !== null && !onCi) console.log(`openssl domain test skipped: ${missing}`);

/** What one `openssl s_client` exchange gave: OpenSSL's verdict on the name, and the answer. */
interface OpensslExchange {
  /** `Verification: OK` was printed: the chain and the host name passed OpenSSL's check. */
  verified: boolean;
  /** The `verify error:num=N` OpenSSL reported, if any (62: hostname mismatch). */
  verifyError: number | null;
  /** The HTTP status of the answer, 0 when none came. */
  status: number;
  /** The answer's body. */
  body: string;
  /** Everything s_client printed on stderr, for failure messages. */
  log: string;
}

/**
 * Sends one HTTP/1.1 GET for `path` to the gateway on loopback `port`, over TLS with SNI and
 * OpenSSL's host name check for `name`, trusting only `caFile`; the Host header is `name:port`.
 */
async function opensslGet(
  port: number,
  name: string,
  caFile: string,
  path: string,
  headers: Record<string, string> = {},
): Promise<OpensslExchange> {
  const child = new Deno.Command("openssl", {
    args: [
      "s_client",
      "-connect",
      `127.0.0.1:${port}`,
      "-CAfile",
      caFile,
      "-servername",
      name,
      "-verify_hostname",
      name,
      // A failed check ends the handshake: nothing is sent to a name OpenSSL refuses.
      "-verify_return_error",
      "-brief",
      // The request's end on stdin must not end the exchange before the answer is read.
      "-ign_eof",
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  const writer = child.stdin.getWriter();
  await writer.write(
    new TextEncoder().encode(
      `GET ${path} HTTP/1.1\r\nHost: ${name}:${port}\r\n${head}Connection: close\r\n\r\n`,
    ),
  );
  await writer.close();
  const timer = setTimeout(() => child.kill(), 15_000);
  const out = await child.output();
  clearTimeout(timer);
  const stdout = new TextDecoder().decode(out.stdout);
  const log = new TextDecoder().decode(out.stderr);
  const error = /verify error:num=(\d+)/.exec(log);
  return {
    verified: /^Verification: OK$/m.test(log),
    verifyError: error ? Number(error[1]) : null,
    status: Number(/^HTTP\/1\.1 (\d{3})/.exec(stdout)?.[1] ?? 0),
    body: stdout.slice(stdout.indexOf("\r\n\r\n") + 4),
    log,
  };
}

async function until(what: string, check: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

Deno.test({
  name: "a new sandbox's names pass OpenSSL's host name check against the domain's wildcard",
  ignore: missing !== null && !onCi,
  // Deno's https client keeps pooled connections to the gateway it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (missing !== null) throw new Error(`CI=true, so the openssl test must run, but ${missing}`);
  const certs = await makeCertificates([`*.${DOMAIN}`]);
  const caFile = `${certs.dir}/ca.pem`;
  const client = Deno.createHttpClient({ caCerts: [certs.ca] });
  const token = newToken();
  const port = freePort();
  const base = `https://127.0.0.1:${port}`;
  let gateway: GatewayProcess | undefined;
  let node: NodeProcess | undefined;
  try {
    // The gateway's directory holds the certificate, so its narrow --allow-read covers it.
    gateway = await startGateway({
      token,
      port,
      dir: certs.dir,
      waitForHealth: false,
      env: {
        ...domainTlsEnv(certs, DOMAIN),
        DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      },
    });
    await until("the gateway to answer over TLS", async () => {
      const res = await fetch(`${base}/healthz`, { client });
      await res.body?.cancel();
      return res.status === 200;
    });
    node = await startNode({
      token,
      env: {
        DORMICE_GATEWAY_ENDPOINT: base,
        DORMICE_NODE_ID: "node-ids",
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        DENO_CERT: caFile,
      },
    });
    await until("the node to check in over https", async () => {
      const res = await fetch(`${base}/listNodes`, {
        client,
        method: "POST",
        headers: { authorization: `Bearer ${token}` },
        body: "{}",
      });
      const { nodes } = await res.json() as { nodes: { state: string; reading: unknown }[] };
      return nodes.some((n) => n.state === "up" && n.reading !== null);
    });

    // The precondition: OpenSSL does check the name here. A label with '_' under the wildcard
    // is refused before any byte of HTTP, as every OpenSSL client refuses it.
    const underscore = await opensslGet(port, `49983-sbx_abc.${DOMAIN}`, caFile, "/health");
    assert.equal(underscore.verifyError, 62, underscore.log);
    assert.equal(underscore.status, 0, underscore.log);

    const res = await fetch(`${base}/e2b/api/sandboxes`, {
      client,
      method: "POST",
      headers: { "x-api-key": token, "content-type": "application/json" },
      body: JSON.stringify({ templateID: "base" }),
    });
    assert.equal(res.status, 201);
    const created = await res.json() as {
      sandboxID: string;
      envdAccessToken: string;
      domain: string;
    };
    assert.equal(created.domain, DOMAIN);

    // envd as the Python SDK reaches it: https://49983-<id>.<domain>/health.
    const envd = await opensslGet(port, `49983-${created.sandboxID}.${DOMAIN}`, caFile, "/health", {
      "x-access-token": created.envdAccessToken,
    });
    assert.equal(envd.verifyError, null, envd.log);
    assert.ok(envd.verified, envd.log);
    assert.equal(envd.status, 204, envd.log);

    // A port, as getHost(8000) names it: routed to this sandbox (nothing listens there).
    const portHost = await opensslGet(port, `8000-${created.sandboxID}.${DOMAIN}`, caFile, "/");
    assert.ok(portHost.verified, portHost.log);
    assert.equal(portHost.status, 502, portHost.log);
    const body = JSON.parse(portHost.body) as { sandboxId: string; message: string; port: number };
    assert.equal(body.sandboxId, created.sandboxID);
    // E2B's own words for a closed port, with the port beside them.
    assert.equal(body.message, "The sandbox is running but port is not open");
    assert.equal(body.port, 8000);
    // E2B's own shape of id: lowercase letters and digits.
    assert.match(created.sandboxID, /^[a-z0-9]{20}$/);
  } finally {
    await node?.stop();
    await gateway?.stop();
    client.close();
    await Deno.remove(certs.dir, { recursive: true }).catch(() => {});
  }
});
