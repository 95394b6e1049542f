/**
 * The SDK half of the sandbox-domain exam (tests/docker_domain_test.ts), run as its own Deno
 * process because only a process started with `DENO_CERT` trusts the test's CA, and only names
 * in /etc/hosts resolve to the gateway on loopback. The official `e2b` SDK is configured by the
 * environment alone, in one of two modes:
 * - `domain`: `E2B_DOMAIN` and `E2B_API_KEY`, nothing else; ports are `https://<port>-<id>.<d>`.
 * - `header`: `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY`; ports are reached on the
 *   sandbox URL with `E2b-Sandbox-Id` and `E2b-Sandbox-Port`.
 *
 * Besides the SDK's own variables it reads `DORMICE_EXAM_MODE` and `DORMICE_EXAM_HOSTS`, the
 * parent's loopback helper that adds a sandbox's names to /etc/hosts (the ids are minted by the
 * node, so the names are known only after each create). Prints `ok <step> (<ms> ms)` per step;
 * the first failed assertion ends the process non-zero with its stack.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";

const mode = Deno.env.get("DORMICE_EXAM_MODE") === "header" ? "header" : "domain";
const hostsHelper = Deno.env.get("DORMICE_EXAM_HOSTS") ?? "";
const sandboxUrl = Deno.env.get("E2B_SANDBOX_URL") ?? "";
const domain = Deno.env.get("E2B_DOMAIN") ?? "";

/** Ports the exam's servers listen on inside the sandbox; 8002 has none. */
const HTTP = 8000;
const SSE = 8001;
const CLOSED = 8002;
const WS = 8765;

async function step(name: string, fn: () => Promise<void>): Promise<void> {
  const start = performance.now();
  await fn();
  console.log(`ok ${name} (${Math.round(performance.now() - start)} ms)`);
}

/** Has the parent map the names a sandbox's ports are reached at (domain mode only). */
async function addHosts(sandboxId: string): Promise<void> {
  if (mode !== "domain") return;
  const names = [49983, HTTP, SSE, CLOSED, WS].map((p) => `${p}-${sandboxId}.${domain}`);
  const res = await fetch(hostsHelper, { method: "POST", body: JSON.stringify(names) });
  assert.equal(res.status, 204, await res.text());
}

/** Where a port's `path` is reached, and the headers that name it, in this mode. */
function portTarget(
  sandbox: Sandbox,
  port: number,
  path: string,
  scheme: "https" | "wss" = "https",
): { url: string; headers: Record<string, string> } {
  if (mode === "domain") return { url: `${scheme}://${sandbox.getHost(port)}${path}`, headers: {} };
  return {
    url: `${sandboxUrl.replace(/^https/, scheme)}${path}`,
    headers: { "e2b-sandbox-id": sandbox.sandboxId, "e2b-sandbox-port": String(port) },
  };
}

/** GETs a port until a server answers other than the proxy's 502 (servers start in the background). */
async function untilServing(
  sandbox: Sandbox,
  port: number,
  path: string,
  headers: Record<string, string> = {},
): Promise<Response> {
  const target = portTarget(sandbox, port, path);
  const deadline = Date.now() + 20_000;
  for (;;) {
    const res = await fetch(target.url, { headers: { ...target.headers, ...headers } });
    if (res.status !== 502) return res;
    const body = await res.text();
    if (Date.now() > deadline) throw new Error(`Port ${port} never served: ${body}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A WebSocket echo server on the standard library (python3 has none of its own). */
const wsEcho = `
import base64, hashlib, socketserver, struct
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        key = None
        while True:
            line = self.rfile.readline(8192)
            if line in (b"\\r\\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "sec-websocket-key":
                key = value.strip().encode()
        if key is None:
            return
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\n"
                         b"Connection: Upgrade\\r\\nSec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\\0\\0\\0\\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                self.wfile.write(b"\\x88\\x00")
                return
            if opcode == 9:
                opcode = 10
            elif opcode == 10:
                continue
            if opcode == 1:
                data = b"echo " + data
            size = len(data)
            length = bytes([size]) if size < 126 else (
                b"\\x7e" + struct.pack(">H", size) if size < 65536 else b"\\x7f" + struct.pack(">Q", size))
            self.wfile.write(bytes([0x80 | opcode]) + length + data)
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
Server(("0.0.0.0", ${WS}), Echo).serve_forever()
`;

/**
 * An event stream whose last event waits for a file the exam writes only after it has read the
 * first: the first event must have crossed both hops unbuffered (no clock decides it).
 */
const sse = `
import http.server, os, time
class Events(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        self.wfile.write(b"data: first\\n\\n")
        self.wfile.flush()
        for _ in range(600):
            if os.path.exists("/tmp/sse-go"):
                break
            time.sleep(0.1)
        self.wfile.write(b"data: last\\n\\n")
http.server.HTTPServer(("0.0.0.0", ${SSE}), Events).serve_forever()
`;

let sandbox!: Sandbox;
await step("Sandbox.create() answers the domain and an envd token", async () => {
  sandbox = await Sandbox.create();
  if (mode === "domain") assert.equal(sandbox.sandboxDomain, domain);
  await addHosts(sandbox.sandboxId);
});

try {
  await step("commands.run through envd", async () => {
    const r = await sandbox.commands.run("echo hi $((6 * 7)); id -un");
    assert.equal(r.stdout, "hi 42\nuser\n");
  });

  await step("files.write and files.read", async () => {
    await sandbox.files.write("/tmp/www/hello.txt", "hello from the sandbox\n");
    assert.equal(await sandbox.files.read("/tmp/www/hello.txt"), "hello from the sandbox\n");
  });

  // With E2B_SANDBOX_URL the SDK builds signed URLs on that URL's root with no sandbox header
  // (E2B-WIRE.md), so nothing in them names the sandbox: only the domain can route them.
  if (mode === "domain") {
    await step("signed downloadUrl and uploadUrl, fetched without the SDK", async () => {
      const down = new URL(await sandbox.downloadUrl("/tmp/www/hello.txt"));
      assert.ok(down.searchParams.get("signature")?.startsWith("v1_"), down.href);
      if (mode === "domain") assert.equal(down.host, `49983-${sandbox.sandboxId}.${domain}`);
      const got = await fetch(down);
      assert.equal(got.status, 200);
      assert.equal(await got.text(), "hello from the sandbox\n");
      const form = new FormData();
      form.append("file", new Blob(["uploaded\n"]), "/tmp/www/up.txt");
      const up = await fetch(await sandbox.uploadUrl("/tmp/www/up.txt"), {
        method: "POST",
        body: form,
      });
      assert.equal(up.status, 200, await up.text());
      assert.equal(await sandbox.files.read("/tmp/www/up.txt"), "uploaded\n");
    });
  } else await sandbox.files.write("/tmp/www/up.txt", "uploaded\n");

  await step(`python3 -m http.server ${HTTP} answers through the gateway`, async () => {
    await sandbox.commands.run(`python3 -m http.server ${HTTP}`, {
      background: true,
      cwd: "/tmp/www",
    });
    const res = await untilServing(sandbox, HTTP, "/hello.txt");
    assert.equal(res.status, 200);
    assert.equal(await res.text(), "hello from the sandbox\n");
    // Keep-alive: a second request on the pooled connection.
    const again = await fetch(portTarget(sandbox, HTTP, "/up.txt").url, {
      headers: portTarget(sandbox, HTTP, "/").headers,
    });
    assert.equal(await again.text(), "uploaded\n");
  });

  {
    await step("a WebSocket echo server in the sandbox answers through both hops", async () => {
      await sandbox.files.write("/tmp/ws_echo.py", wsEcho);
      await sandbox.commands.run("python3 /tmp/ws_echo.py", { background: true });
      const target = portTarget(sandbox, WS, "/echo", "wss");
      const deadline = Date.now() + 20_000;
      let echoed: unknown[] | undefined;
      while (echoed === undefined) {
        // The server starts in the background: a refused handshake is retried until the bound.
        echoed = await new Promise<unknown[] | undefined>((resolve, reject) => {
          const ws = new WebSocket(target.url, { headers: target.headers } as unknown as string[]);
          ws.binaryType = "arraybuffer";
          const got: unknown[] = [];
          const timer = setTimeout(() => reject(new Error("no echo in 10 s")), 10_000);
          ws.onopen = () => {
            ws.send("hi");
            ws.send(new Uint8Array([1, 2, 3]));
          };
          ws.onmessage = (e) => {
            got.push(typeof e.data === "string" ? e.data : [...new Uint8Array(e.data)]);
            if (got.length === 2) {
              clearTimeout(timer);
              ws.onclose = () => resolve(got);
              ws.close();
            }
          };
          ws.onerror = () => {
            clearTimeout(timer);
            if (Date.now() > deadline) {
              reject(new Error(`The WebSocket on port ${WS} never opened`));
            } else setTimeout(() => resolve(undefined), 200);
          };
        });
      }
      assert.deepEqual(echoed, ["echo hi", [1, 2, 3]]);
    });
  }

  await step("an event stream's first event arrives before the last is written", async () => {
    await sandbox.files.write("/tmp/sse.py", sse);
    await sandbox.commands.run("python3 /tmp/sse.py", { background: true });
    const res = await untilServing(sandbox, SSE, "/events");
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    const timer = setTimeout(() => reader.cancel(new Error("no first event in 10 s")), 10_000);
    while (!text.includes("data: first\n\n")) {
      const r = await reader.read();
      if (r.done) break;
      text += r.value;
    }
    clearTimeout(timer);
    assert.equal(text, "data: first\n\n");
    await sandbox.files.write("/tmp/sse-go", "");
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value;
    assert.equal(text, "data: first\n\ndata: last\n\n");
  });

  await step("the 502 shapes: an unknown sandbox, a port nothing listens on", async () => {
    const unknown = mode === "domain"
      ? await fetch(`https://8000-sbx_nope.${domain}/`)
      : await fetch(`${sandboxUrl}/`, {
        headers: { "e2b-sandbox-id": "sbx_nope", "e2b-sandbox-port": "8000" },
      });
    assert.equal(unknown.status, 502);
    assert.deepEqual(await unknown.json(), {
      message: "The sandbox was not found",
      sandboxId: "sbx_nope",
      code: 502,
    });
    const target = portTarget(sandbox, CLOSED, "/");
    const closed = await fetch(target.url, { headers: target.headers });
    assert.equal(closed.status, 502);
    const body = await closed.json() as { message: string; sandboxId: string; code: number };
    assert.equal(body.message, "The sandbox is running but port is not open");
    assert.deepEqual([body.sandboxId, body.code], [sandbox.sandboxId, 502]);
  });

  await step("a sandbox without public traffic requires its traffic access token", async () => {
    const secure = await Sandbox.create({ network: { allowPublicTraffic: false } });
    try {
      await addHosts(secure.sandboxId);
      const token = secure.trafficAccessToken;
      assert.equal(typeof token, "string");
      await secure.files.write("/tmp/www/s.txt", "secret\n");
      await secure.commands.run(`python3 -m http.server ${HTTP}`, {
        background: true,
        cwd: "/tmp/www",
      });
      const right = await untilServing(secure, HTTP, "/s.txt", {
        "e2b-traffic-access-token": token!,
      });
      assert.equal(await right.text(), "secret\n");
      const target = portTarget(secure, HTTP, "/s.txt");
      const without = await fetch(target.url, { headers: target.headers });
      assert.equal(without.status, 403);
      assert.match((await without.json()).message, /e2b-traffic-access-token/);
      const wrong = await fetch(target.url, {
        headers: { ...target.headers, "e2b-traffic-access-token": "x".repeat(token!.length) },
      });
      assert.equal(wrong.status, 403);
      await wrong.body?.cancel();
      // Ports of the other sandbox stay public.
      const open = await fetch(portTarget(sandbox, HTTP, "/hello.txt").url, {
        headers: portTarget(sandbox, HTTP, "/").headers,
      });
      assert.equal(open.status, 200);
      await open.body?.cancel();
    } finally {
      await secure.kill();
    }
  });
} finally {
  await sandbox.kill();
}
