/**
 * `network.httpsPorts` on Docker: a sandbox created through the gateway's E2B API with port
 * 8443 listed serves HTTPS there with a certificate it made itself (openssl, self-signed); the
 * port's route (gateway, then node, then the container) speaks TLS to it without verifying that
 * certificate and answers its content, and the sandbox's detail echoes the list. The same
 * server on a port not listed is a 502: the node speaks plain HTTP to the ports it was not told
 * serve HTTPS.
 *
 * Needs an engine and the base image (`.ci/docker.sh`): with `CI=true` it never skips; off CI
 * it skips with a printed reason.
 */
import assert from "node:assert/strict";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const gate = await dockerGate("docker httpsPorts test");

/** A Python HTTPS server answering "https backend" on `port`, with the cert made beforehand. */
const server = (port: number) =>
  `python3 -c "
import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'https backend')
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(('0.0.0.0', ${port}), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain('/tmp/cert.pem', '/tmp/key.pem')
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"`;

Deno.test({
  name: "docker httpsPorts: a listed port is reached over TLS (self-signed), and echoed back",
  ignore: gate.skip,
  // Child processes and dockerode's pooled unix sockets outlive single steps by design.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  let gw: GatewayProcess | undefined;
  let node: DockerNodeProcess | undefined;
  const nodeId = `dkhttps-${crypto.randomUUID().slice(0, 8)}`;
  try {
    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const g = gw;
    node = await startDockerNode({ token: g.token, gatewayUrl: g.url, nodeId });
    await until("the docker node to be up at the gateway", async () => {
      const { body } = await g.json("listNodes");
      return body.nodes.some((n: { id: string; state: string }) =>
        n.id === nodeId && n.state === "up"
      );
    });
    const name = `https-${crypto.randomUUID().slice(0, 8)}`;
    const api = (method: string, path: string, body?: unknown) =>
      fetch(`${g.url}/e2b/api${path}`, {
        method,
        headers: { "x-api-key": g.token, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    const made = await api("POST", "/v2/sandboxes", {
      templateID: "base",
      metadata: { name },
      network: { httpsPorts: [8443] },
    });
    const madeBody = await made.json();
    assert.equal(made.status, 201, JSON.stringify(madeBody));
    const id: string = madeBody.sandboxID;

    const keygen = await g.json("execCommand", {
      name,
      command: "openssl req -x509 -newkey rsa:2048 -keyout /tmp/key.pem -out /tmp/cert.pem " +
        '-days 1 -nodes -subj "/CN=localhost" 2>/dev/null',
    });
    assert.equal(keygen.status, 200, JSON.stringify(keygen.body));
    assert.equal(keygen.body.exitCode, 0, JSON.stringify(keygen.body));
    for (const port of [8443, 9443]) {
      const started = await g.json("execCommand", {
        name,
        command: `setsid ${server(port)} >/dev/null 2>&1 < /dev/null &`,
      });
      assert.equal(started.status, 200, JSON.stringify(started.body));
    }

    const get = (port: number) =>
      fetch(`${g.url}/e2b/envd/`, {
        headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": String(port) },
      });
    let status = 0;
    let text = "";
    for (let i = 0; i < 100; i++) {
      const res = await get(8443);
      status = res.status;
      text = await res.text();
      // The server takes a moment to listen: until then the port is closed (E2B's 502).
      if (status === 200 || !/port is not open/.test(text)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(status, 200, text);
    assert.equal(text, "https backend");

    // The same kind of server on a port not listed: spoken to in plain HTTP, it fails.
    let unlisted: Response | undefined;
    let unlistedText = "";
    for (let i = 0; i < 100; i++) {
      unlisted = await get(9443);
      unlistedText = await unlisted.text();
      // Until the server listens its connections are refused; then plain HTTP meets its TLS.
      if (!/refused/i.test(unlistedText)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.doesNotMatch(unlistedText, /refused/i, "the server on 9443 never listened");
    assert.notEqual(unlisted?.status, 200, unlistedText);

    const info = await api("GET", `/sandboxes/${id}`);
    const detail = await info.json();
    assert.equal(info.status, 200, JSON.stringify(detail));
    assert.deepEqual(detail.network?.httpsPorts, [8443]);
    // The native face shows it in the spec.
    const listed = await g.json("listSandboxes", {});
    assert.equal(listed.status, 200, JSON.stringify(listed.body));
    const row = listed.body.sandboxes.find((s: { id: string }) => s.id === id);
    assert.deepEqual(row?.spec?.httpsPorts, [8443], JSON.stringify(listed.body));

    // A bad list is a 400 naming the field.
    const bad = await api("POST", "/v2/sandboxes", {
      templateID: "base",
      network: { httpsPorts: [0] },
    });
    const badBody = await bad.json();
    assert.equal(bad.status, 400, JSON.stringify(badBody));
    assert.match(badBody.message, /'network\.httpsPorts' holds 0, which is not a port/);
  } finally {
    await node?.stop();
    await gw?.stop();
    await removeContainersOf([nodeId]);
  }
});
