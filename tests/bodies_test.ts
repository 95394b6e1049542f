/**
 * Huge bodies against the real daemons. A node and a gateway run as
 * processes; their resident memory is read from `/proc/<pid>/status` while large uploads
 * stream through them, and must stay far below the bytes sent (a memory bound, not a timing
 * one). Bodies past a cap are a 413 (or a Connect error) with the sentence, never a 500, on the
 * node and through the gateway.
 *
 * The uploads go to `/dev/null`, which the fake executor swallows, so the node's memory is what
 * the node holds, not what the fake stores.
 *
 * Measured while building these (Deno 2.9.6, loopback): a body streamed by a fetch client
 * (Deno's or Node's undici) through any Deno server that forwards it with fetch, the gateway or
 * a 10-line Deno.serve proxy alike, runs at ~20 MB/s and the proxy's RSS grows with the bytes
 * (4 × 128 MiB: 35 → 259 MB; 4 × 256 MiB through the gateway: 65 → 511 MB), though its inbound
 * and outbound finish within milliseconds of each other (nothing is queued); curl, or a sized
 * body from the same fetch client, goes through at 250+ MB/s with the RSS flat. So the gateway
 * round sends sized bodies (what the SDK's default multipart write sends) and the streamed ones
 * go to the node directly.
 */
import assert from "node:assert/strict";
import { startGateway } from "./_gateway.ts";
import { freePort, newToken, startNode } from "./_processes.ts";

const MiB = 1024 * 1024;
const CHUNK = 64 * 1024;

/**
 * A process's resident memory now and its peak so far (`VmRSS`, `VmHWM`), bytes. Read through
 * `cat`: Deno asks for --allow-all to read /proc itself, and the test task grants --allow-run.
 */
async function memoryOf(pid: number): Promise<{ rss: number; peak: number }> {
  const out = await new Deno.Command("cat", { args: [`/proc/${pid}/status`] }).output();
  if (!out.success) throw new Error(`cannot read /proc/${pid}/status: is the process gone?`);
  const status = new TextDecoder().decode(out.stdout);
  const field = (name: string) => {
    const m = new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status);
    if (!m) throw new Error(`/proc/${pid}/status has no ${name}`);
    return Number(m[1]) * 1024;
  };
  return { rss: field("VmRSS"), peak: field("VmHWM") };
}

/** Samples `pid`'s RSS every 20 ms until stopped; the highest sample. */
function sampleRss(pid: number): { stop(): Promise<number> } {
  let highest = 0;
  let running = true;
  const loop = (async () => {
    while (running) {
      highest = Math.max(highest, (await memoryOf(pid)).rss);
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return highest;
    },
  };
}

/** `total` bytes of a repeating pattern, as a stream of 64 KiB chunks (never held whole). */
function bytesStream(total: number): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream({
    pull(c) {
      if (sent >= total) return c.close();
      const n = Math.min(CHUNK, total - sent);
      c.enqueue(new Uint8Array(n).fill(sent / CHUNK & 0xff));
      sent += n;
    },
  }, { highWaterMark: 0 });
}

/** A one-file multipart body around a stream, with the boundary for its Content-Type. */
function multipartStream(path: string, total: number) {
  const boundary = "----dormice-bodies-test";
  const encoder = new TextEncoder();
  const head = encoder.encode(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${path}"\r\n` +
      "Content-Type: application/octet-stream\r\n\r\n",
  );
  const tail = encoder.encode(`\r\n--${boundary}--\r\n`);
  const data = bytesStream(total).getReader();
  let stage = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(c) {
      if (stage === 0) {
        stage = 1;
        return c.enqueue(head);
      }
      if (stage === 1) {
        const { done, value } = await data.read();
        if (!done) return c.enqueue(value);
        stage = 2;
        return c.enqueue(tail);
      }
      c.close();
    },
  }, { highWaterMark: 0 });
  return { body, contentType: `multipart/form-data; boundary=${boundary}` };
}

/** A fleet of one: a gateway and a node checked in with it, and one E2B sandbox on the node. */
async function fleet(env: { node?: Record<string, string>; gateway?: Record<string, string> }) {
  const token = newToken();
  const gwPort = freePort();
  const gwUrl = `http://127.0.0.1:${gwPort}`;
  const started: { stop(): Promise<unknown> }[] = [];
  const stop = () => Promise.all(started.splice(0).map((p) => p.stop()));
  try {
    const [gw, node] = await Promise.all([
      startGateway({
        token,
        port: gwPort,
        env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100", ...env.gateway },
      }).then((g) => (started.push(g), g)),
      startNode({
        token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: gwUrl,
          // Not 1 s: a node busy streaming gigabytes checks in late, and the gateway cuts off
          // the forwards of a node that missed two check-ins (measured with 4 × 512 MiB).
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "5",
          ...env.node,
        },
      }).then((n) => (started.push(n), n)),
    ]);
    const deadline = Date.now() + 10_000;
    for (;;) {
      const { body } = await gw.json("listNodes");
      if (
        body.nodes.some((n: { state: string; reading: unknown }) => n.state === "up" && n.reading)
      ) {
        break;
      }
      if (Date.now() > deadline) throw new Error("the node did not check in within 10 s");
      await new Promise((r) => setTimeout(r, 100));
    }
    const res = await fetch(`${gw.url}/e2b/api/sandboxes`, {
      method: "POST",
      headers: { "x-api-key": token, "content-type": "application/json" },
      body: JSON.stringify({ templateID: "base" }),
    });
    assert.equal(res.status, 201, await res.clone().text());
    const { sandboxID, envdAccessToken } = await res.json();
    const envdHeaders = {
      "E2b-Sandbox-Id": sandboxID,
      "X-Access-Token": envdAccessToken,
    } as Record<string, string>;
    const { body } = await gw.json("lookupSandbox", { id: sandboxID });
    const name: string = body.sandbox.name;
    return { token, gw, node, sandboxID, name, envdHeaders, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

type Fleet = Awaited<ReturnType<typeof fleet>>;

/**
 * How an upload is sent: a sized body (what the SDK's default multipart write sends: a Blob, so
 * a Content-Length) or a stream of unknown length (the SDK's streamed and gzip writes).
 */
type Form = "sized-octet" | "sized-multipart" | "streamed-octet" | "streamed-multipart";

/** Uploads `data` (or a stream of `size` bytes) to `/dev/null` through `base`'s envd `/files`. */
async function upload(
  f: Fleet,
  base: string,
  form: Form,
  data: Blob,
): Promise<{ status: number; body: unknown }> {
  let url = `${base}/e2b/envd/files?path=/dev/null`;
  let body: BodyInit;
  const headers: Record<string, string> = { ...f.envdHeaders };
  if (form === "sized-octet") {
    body = data;
    headers["content-type"] = "application/octet-stream";
  } else if (form === "sized-multipart") {
    url = `${base}/e2b/envd/files`;
    const formData = new FormData();
    formData.append("file", data, "/dev/null");
    body = formData;
  } else if (form === "streamed-octet") {
    body = bytesStream(data.size);
    headers["content-type"] = "application/octet-stream";
  } else {
    url = `${base}/e2b/envd/files`;
    const m = multipartStream("/dev/null", data.size);
    body = m.body;
    headers["content-type"] = m.contentType;
  }
  const res = await fetch(url, { method: "POST", headers, body, duplex: "half" } as RequestInit);
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch { /* kept as text */ }
  return { status: res.status, body: parsed };
}

Deno.test({
  name: "node and gateway memory stays far below the bytes of concurrent large /files uploads",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const f = await fleet({ node: { DORMICE_UPLOAD_LIMIT_MB: "512" } });
  try {
    const size = 256 * MiB;
    // One Blob for every sized upload: the test process holds it once.
    const data = new Blob([new Uint8Array(size).fill(7)]);
    const rounds: { via: "node" | "gateway"; forms: Form[] }[] = [
      {
        via: "node",
        forms: ["sized-octet", "sized-multipart", "streamed-octet", "streamed-multipart"],
      },
      // Sized only: a body streamed by a fetch client makes Deno's server and fetch pair, the
      // gateway's forward, crawl at ~20 MB/s and grow with the bytes (a plain 10-line
      // Deno.serve + fetch proxy does the same; curl through the gateway stays flat).
      {
        via: "gateway",
        forms: ["sized-octet", "sized-multipart", "sized-octet", "sized-multipart"],
      },
    ];
    for (const { via, forms } of rounds) {
      const base = via === "node" ? f.node.url : f.gw.url;
      const watched = [f.node.process, f.gw.process];
      const before = await Promise.all(watched.map((p) => memoryOf(p.child.pid)));
      const samplers = watched.map((p) => sampleRss(p.child.pid));
      const started = performance.now();
      const results = await Promise.all(forms.map((form) => upload(f, base, form, data)));
      const highest = await Promise.all(samplers.map((s) => s.stop()));
      const after = await Promise.all(watched.map((p) => memoryOf(p.child.pid)));
      for (const r of results) {
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.deepEqual(r.body, [{ path: "/dev/null", name: "null", type: "file" }]);
      }
      const sent = forms.length * size;
      watched.forEach((p, i) => {
        const who = p === f.gw.process ? "gateway" : "node";
        const grew = Math.max(highest[i], after[i].peak) - before[i].rss;
        console.log(
          `${forms.length} uploads of ${size / MiB} MiB via the ${via} in ` +
            `${Math.round(performance.now() - started)} ms: the ${who}'s RSS rose ` +
            `${(grew / MiB).toFixed(1)} MiB (from ${(before[i].rss / MiB).toFixed(1)} MiB)`,
        );
        // Held whole, the uploads would cost the sum of their sizes; streamed, the node's own
        // buffers plus the runtime's (about 100 MiB the first time, measured).
        assert.ok(
          grew < sent / 4,
          `the ${who}'s RSS rose ${(grew / MiB).toFixed(1)} MiB while ${sent / MiB} MiB went ` +
            `through the ${via}: the bodies are being held`,
        );
      });
    }
  } finally {
    await f.stop();
  }
});

/** A JSON `writeFile` body of about `bytes` bytes, whole or as a stream of unknown length. */
function writeFileBody(name: string, bytes: number, streamed: boolean): BodyInit {
  const head = new TextEncoder().encode(
    `{"name":${JSON.stringify(name)},"path":"/tmp/big.txt","content":"`,
  );
  const tail = new TextEncoder().encode('"}');
  if (!streamed) {
    const whole = new Uint8Array(bytes).fill(0x61);
    whole.set(head);
    whole.set(tail, bytes - tail.length);
    return whole;
  }
  const filler = bytesStream(bytes - head.length - tail.length).pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      start: (c) => c.enqueue(head),
      transform: (chunk, c) => c.enqueue(chunk.fill(0x61)),
      flush: (c) => c.enqueue(tail),
    }),
  );
  return filler;
}

/** POSTs and reads status and JSON body (or text). */
async function send(
  url: string,
  headers: Record<string, string>,
  body: BodyInit,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url, { method: "POST", headers, body, duplex: "half" } as RequestInit);
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) };
  } catch {
    return { status: res.status, body: { text } };
  }
}

// Both engines of serveGuarded: with the WebSocket switch on, Deno.serveHttp resets a connection
// whose body was begun and not finished, so an early 413 needs the body read to its end first.
for (const websockets of ["off", "on"]) {
  Deno.test({
    name:
      `a body past a cap is a 413 naming the cap and /files (a Connect error on RPCs), never a 500 (WebSockets ${websockets})`,
    sanitizeResources: false,
    sanitizeOps: false,
  }, async (t) => {
    const f = await fleet({
      node: {
        DORMICE_JSON_BODY_LIMIT_MB: "4",
        DORMICE_UPLOAD_LIMIT_MB: "8",
        DORMICE_WEBSOCKETS: websockets,
      },
      gateway: { DORMICE_GATEWAY_JSON_BODY_LIMIT_MB: "4", DORMICE_GATEWAY_WEBSOCKETS: websockets },
    });
    const bearer = { authorization: `Bearer ${f.token}`, "content-type": "application/json" };
    const over = 6 * MiB;
    try {
      await t.step(
        "native writeFile: on the gateway and on the node, declared or streamed",
        async () => {
          for (
            const [who, base, variable] of [
              ["gateway", f.gw.url, "DORMICE_GATEWAY_JSON_BODY_LIMIT_MB"],
              ["node", f.node.url, "DORMICE_JSON_BODY_LIMIT_MB"],
            ]
          ) {
            for (const streamed of [false, true]) {
              const r = await send(
                `${base}/writeFile`,
                bearer,
                writeFileBody(f.name, over, streamed),
              );
              assert.equal(
                r.status,
                413,
                `${who}, streamed=${streamed}: ${JSON.stringify(r.body)}`,
              );
              assert.match(
                String(r.body.message),
                new RegExp(`cap of 4 MiB \\(${variable}\\): .*POST /files.*streams`),
              );
            }
          }
          // Under the cap, the same verb goes through both hops.
          const ok = await send(
            `${f.gw.url}/writeFile`,
            bearer,
            writeFileBody(f.name, 3 * MiB, true),
          );
          assert.equal(ok.status, 200, JSON.stringify(ok.body));
        },
      );

      await t.step("the E2B control plane answers {code:413, message}", async () => {
        const r = await send(`${f.gw.url}/e2b/api/sandboxes`, {
          "x-api-key": f.token,
          "content-type": "application/json",
        }, writeFileBody(f.name, over, true));
        assert.equal(r.status, 413);
        assert.equal(r.body.code, 413);
        assert.match(String(r.body.message), /cap of 4 MiB/);
      });

      await t.step(
        "Connect unary and stream bodies are invalid_argument naming the cap",
        async () => {
          for (const base of [f.gw.url, f.node.url]) {
            const unary = await send(`${base}/e2b/envd/filesystem.Filesystem/Stat`, {
              ...f.envdHeaders,
              "content-type": "application/json",
            }, writeFileBody(f.name, over, true));
            assert.equal(unary.status, 400, JSON.stringify(unary.body));
            assert.equal(unary.body.code, "invalid_argument");
            // An RPC's request is a one-piece message: the node's smaller cap.
            assert.match(
              String(unary.body.message),
              /cap of 1 MiB \(DORMICE_JSON_MESSAGE_LIMIT_KB\)/,
            );
            const stream = await send(`${base}/e2b/envd/process.Process/Start`, {
              ...f.envdHeaders,
              "content-type": "application/connect+json",
            }, bytesStream(over));
            assert.equal(stream.status, 400, JSON.stringify(stream.body));
            assert.equal(stream.body.code, "invalid_argument");
            assert.match(String(stream.body.message), /cap of 1 MiB/);
          }
        },
      );

      await t.step("/files past the upload cap, direct and through the gateway", async () => {
        const octet = { ...f.envdHeaders, "content-type": "application/octet-stream" };
        const url = (base: string) => `${base}/e2b/envd/files?path=/tmp/over.bin`;
        const declared = await send(url(f.node.url), octet, new Blob([new Uint8Array(9 * MiB)]));
        assert.equal(declared.status, 413);
        assert.match(String(declared.body.message), /cap of 8 MiB .*DORMICE_UPLOAD_LIMIT_MB/);
        for (const base of [f.node.url, f.gw.url]) {
          const streamed = await send(url(base), octet, bytesStream(12 * MiB));
          assert.equal(streamed.status, 413, JSON.stringify(streamed.body));
          assert.equal(streamed.body.code, 413);
          // 64 MiB of zeros is 64 KiB of gzip: refused once it inflates 100 times its size.
          const bomb = await send(
            url(base),
            { ...octet, "content-encoding": "gzip" },
            bytesStream(64 * MiB).pipeThrough(
              new CompressionStream("gzip") as unknown as ReadableWritablePair<
                Uint8Array,
                Uint8Array
              >,
            ),
          );
          assert.equal(bomb.status, 413, JSON.stringify(bomb.body));
          assert.match(
            String(bomb.body.message),
            /more than 100 times its size.*DORMICE_UPLOAD_GZIP_MAX_RATIO/,
          );
        }
      });
    } finally {
      await f.stop();
    }
  });
}

Deno.test({
  name: "the gateway's memory stays bounded while it refuses concurrent JSON bodies past its cap",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const f = await fleet({ gateway: { DORMICE_GATEWAY_JSON_BODY_LIMIT_MB: "8" } });
  const bearer = { authorization: `Bearer ${f.token}`, "content-type": "application/json" };
  try {
    const pid = f.gw.process.child.pid;
    const before = await memoryOf(pid);
    const sampler = sampleRss(pid);
    const size = 128 * MiB;
    // Half declare their length (refused unread), half stream it (read up to the cap).
    const results = await Promise.all(
      Array.from(
        { length: 8 },
        (_, i) => send(`${f.gw.url}/writeFile`, bearer, writeFileBody(f.name, size, i % 2 === 1)),
      ),
    );
    const highest = await sampler.stop();
    const after = await memoryOf(pid);
    for (const r of results) {
      assert.equal(r.status, 413, JSON.stringify(r.body));
      assert.match(String(r.body.message), /cap of 8 MiB \(DORMICE_GATEWAY_JSON_BODY_LIMIT_MB\)/);
    }
    const grew = Math.max(highest, after.peak) - before.rss;
    console.log(
      `8 writeFile bodies of 128 MiB refused: the gateway's RSS rose ${
        (grew / MiB).toFixed(1)
      } MiB`,
    );
    // Read whole (before the cap), they cost the gateway about three times their 1 GiB.
    assert.ok(grew < 128 * MiB, `the gateway's RSS rose ${(grew / MiB).toFixed(1)} MiB`);
  } finally {
    await f.stop();
  }
});
