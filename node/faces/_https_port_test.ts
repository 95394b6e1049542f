/**
 * `fetchSandboxTls` against a TLS server whose certificate no store trusts (a CA made for the
 * test and never given to the client): the answer streams back, a body goes up, the masked
 * Host is sent, and an abort ends the request.
 */
import assert from "node:assert/strict";
import { makeCertificates, opensslMissing } from "../../shared/_tls_fixtures_test.ts";
import { fetchSandboxTls } from "./_https_port.ts";

const missing = await opensslMissing();
if (missing !== null && Deno.env.get("CI") !== "true") {
  console.log(`fetchSandboxTls tests skipped: ${missing}`);
}

Deno.test({
  name: "fetchSandboxTls reaches an untrusted TLS server: status, headers, bodies, Host",
  ignore: missing !== null && Deno.env.get("CI") !== "true",
}, async () => {
  const certs = await makeCertificates(["sandbox.test"]);
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, cert: certs.cert, key: certs.key, onListen: () => {} },
    async (req) =>
      new Response(`${req.method} ${new URL(req.url).pathname} ${await req.text()}`, {
        status: 201,
        headers: { "x-host": req.headers.get("host") ?? "", "x-seen": "1" },
      }),
  );
  try {
    const port = server.addr.port;
    const got = await fetchSandboxTls("127.0.0.1", port, "/p?q=1", {
      method: "GET",
      headers: new Headers({ host: "custom.example:8443" }),
      body: null,
      signal: AbortSignal.timeout(10_000),
    });
    assert.equal(got.status, 201);
    assert.equal(got.headers.get("x-seen"), "1");
    assert.equal(got.headers.get("x-host"), "custom.example:8443");
    assert.equal(await got.text(), "GET /p ");
    const posted = await fetchSandboxTls("127.0.0.1", port, "/up", {
      method: "POST",
      headers: new Headers(),
      body: new Blob(["hello"]).stream(),
      signal: AbortSignal.timeout(10_000),
    });
    assert.equal(await posted.text(), "POST /up hello");
    const aborted = new AbortController();
    aborted.abort(new Error("the client left"));
    await assert.rejects(
      fetchSandboxTls("127.0.0.1", port, "/", {
        method: "GET",
        headers: new Headers(),
        body: null,
        signal: aborted.signal,
      }),
      /the client left/,
    );
  } finally {
    await server.shutdown();
    await Deno.remove(certs.dir, { recursive: true });
  }
});
