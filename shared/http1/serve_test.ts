import { makeCertificates } from "../_tls_fixtures_test.ts";
import assert from "node:assert/strict";
import { FakeClock } from "../clock.ts";
import { type GuardedServeOptions, serveGuarded } from "./serve.ts";
import { StreamCut } from "../stream_cut.ts";

const decoder = new TextDecoder();

/** A raw client socket: what it wrote, and whether the server has closed it. */
async function rawClient(port: number) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  let received = "";
  let closedBy = false;
  const reading = (async () => {
    const buf = new Uint8Array(4096);
    try {
      for (;;) {
        const n = await conn.read(buf);
        if (n === null) break;
        received += decoder.decode(buf.subarray(0, n));
      }
    } catch {
      // reset: closed as well
    }
    closedBy = true;
  })();
  return {
    write: (text: string) => conn.write(new TextEncoder().encode(text)),
    received: () => received,
    closed: () => closedBy,
    /** Resolves once the server closed it, or rejects after `ms` real milliseconds. */
    async closedWithin(ms: number) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const bound = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`still open after ${ms} ms`)), ms);
      });
      try {
        await Promise.race([reading, bound]);
      } finally {
        clearTimeout(timer);
      }
    },
    async until(text: string, ms = 2000) {
      const end = Date.now() + ms;
      while (!received.includes(text)) {
        if (Date.now() > end) throw new Error(`no '${text}' within ${ms} ms: got ${received}`);
        await new Promise((r) => setTimeout(r, 5));
      }
    },
    close: () => {
      try {
        conn.close();
      } catch {
        // already closed
      }
    },
    reading,
  };
}

function startWith(options: Partial<GuardedServeOptions> = {}) {
  const clock = new FakeClock();
  const server = serveGuarded({
    hostname: "127.0.0.1",
    port: 0,
    handler: () => new Response("ok"),
    clock,
    sweepIntervalMs: 0,
    headerTimeoutMs: 1_000,
    idleTimeoutMs: 5_000,
    ...options,
  });
  return { server, clock, port: server.addr.port };
}

/** Waits (really) until the server has accepted `n` connections. */
async function accepted(server: { connections(): number }, n: number) {
  const end = Date.now() + 2000;
  while (server.connections() < n) {
    if (Date.now() > end) throw new Error(`only ${server.connections()} of ${n} accepted`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

const GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";

/**
 * The guard's rules, on both engines: the daemons serve with `upgrades` (Deno.serveHttp), an
 * embedder may serve without (Deno's per-connection server).
 */
function guardSuite(upgrades: boolean, engine: "deno" | "bytes" = "deno") {
  const name = upgrades
    ? "serveGuarded({ upgrades })"
    : engine === "bytes"
    ? 'serveGuarded({ engine: "bytes" })'
    : "serveGuarded()";
  const start = (options: Partial<GuardedServeOptions> = {}) =>
    startWith({ upgrades, engine, ...options });

  Deno.test(name + " answers requests and keeps the connection alive", async () => {
    const { server, port } = start();
    const c = await rawClient(port);
    await c.write(GET);
    await c.until("ok");
    await c.until("ok");
    await c.write(GET);
    const end = Date.now() + 2000;
    while (c.received().split("HTTP/1.1 200").length < 3 && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(c.received().split("HTTP/1.1 200").length, 3, "the same socket answered twice");
    assert.equal(c.closed(), false);
    c.close();
    await server.shutdown();
  });

  Deno.test(name + " logs nothing about accepting when no accept failed", async () => {
    const lines: string[] = [];
    const { server, port } = start({ log: (_level, msg) => void lines.push(msg) });
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`http://127.0.0.1:${port}/`, { headers: { connection: "close" } });
      assert.equal(await res.text(), "ok");
    }
    await server.shutdown();
    // A fresh server's first connection is not a recovery ("accepting connections again").
    assert.deepEqual(lines.filter((l) => /accept/i.test(l)), []);
  });

  Deno.test(name + " closes a connection that sends nothing after the header timeout", async () => {
    const { server, clock, port } = start();
    const c = await rawClient(port);
    await accepted(server, 1);
    clock.tick(999);
    assert.equal(server.sweep(), 0, "closed before its header timeout");
    clock.tick(1);
    assert.equal(server.sweep(), 1);
    await c.closedWithin(2000);
    await server.shutdown();
  });

  Deno.test(name + " closes a connection trickling its head after the header timeout", async () => {
    const { server, clock, port } = start();
    const c = await rawClient(port);
    await accepted(server, 1);
    for (const part of ["GET / HT", "TP/1.1\r\n", "Host: x\r\n", "X-Slow: 1\r\n"]) {
      await c.write(part);
      clock.tick(300);
      server.sweep();
    }
    await c.closedWithin(2000);
    assert.equal(c.received(), "", "a head that never finished got an answer");
    await server.shutdown();
  });

  Deno.test(
    name + " closes a kept-alive connection after the idle timeout, not before",
    async () => {
      const { server, clock, port } = start();
      const c = await rawClient(port);
      await c.write(GET);
      await c.until("ok");
      await new Promise((r) => setTimeout(r, 20)); // the answer's completion is reported after the write
      clock.tick(4_999);
      assert.equal(server.sweep(), 0, "a kept-alive connection was closed before its idle timeout");
      assert.equal(c.closed(), false);
      clock.tick(1);
      assert.equal(server.sweep(), 1);
      await c.closedWithin(2000);
      await server.shutdown();
    },
  );

  Deno.test(name + " never closes a connection with a request in flight", async () => {
    let release!: () => void;
    const parked = new Promise<void>((r) => release = r);
    const { server, clock, port } = start({
      handler: async () => {
        await parked;
        return new Response("late");
      },
    });
    const c = await rawClient(port);
    await c.write(GET);
    await accepted(server, 1);
    await new Promise((r) => setTimeout(r, 20));
    clock.tick(60_000);
    assert.equal(server.sweep(), 0);
    release();
    await c.until("late");
    c.close();
    await server.shutdown();
  });

  Deno.test(name + " tells the handler of a client that hangs up before the head", async () => {
    // A proxy ties its upstream request to request.signal and streams the body on: a client
    // that leaves while the answer's head is still awaited must reach the handler, by the signal
    // after a whole request, by the signal or a failing body read in the middle of a body.
    for (const head of [GET, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab"]) {
      let seen!: (signal: AbortSignal) => void;
      const arrived = new Promise<AbortSignal>((r) => seen = r);
      let bodyFailed!: (failed: true) => void;
      const failedBody = new Promise<true>((r) => bodyFailed = r);
      const { server, port } = start({
        handler: (request) => {
          seen(request.signal);
          request.body?.pipeTo(new WritableStream()).catch(() => bodyFailed(true));
          // Answered at the abort, or after 3 s when none comes (so the shutdown is bounded).
          return new Promise<Response>((resolve) => {
            const answer = () => {
              clearTimeout(fallback);
              resolve(new Response("gone"));
            };
            const fallback = setTimeout(answer, 3000);
            request.signal.addEventListener("abort", answer);
          });
        },
      });
      const c = await rawClient(port);
      await c.write(head);
      const signal = await arrived;
      assert.equal(signal.aborted, false, "aborted before the client left");
      c.close();
      let timer: ReturnType<typeof setTimeout> | undefined;
      const aborted = new Promise<true>((r) => {
        if (signal.aborted) r(true);
        signal.addEventListener("abort", () => r(true));
      });
      const late = new Promise<false>((r) => timer = setTimeout(() => r(false), 2000));
      const told = head === GET ? aborted : Promise.race([aborted, failedBody]);
      const outcome = await Promise.race([told, late]);
      clearTimeout(timer);
      assert.equal(outcome, true, `not told within 2 s of the hang-up (${head.split(" ")[0]})`);
      await server.shutdown();
    }
  });

  Deno.test(
    name + " at its cap closes the longest-idle connection to admit a new one",
    async () => {
      const { server, clock, port } = start({ maxConnections: 2 });
      const first = await rawClient(port);
      await accepted(server, 1);
      clock.tick(10);
      const second = await rawClient(port);
      await accepted(server, 2);
      const third = await rawClient(port);
      await first.closedWithin(2000);
      assert.equal(second.closed(), false);
      await third.write(GET);
      await third.until("ok");
      second.close();
      third.close();
      await server.shutdown();
    },
  );

  Deno.test(name + " at its cap with every connection busy refuses the new one", async () => {
    let release!: () => void;
    const parked = new Promise<void>((r) => release = r);
    const { server, port } = start({
      maxConnections: 1,
      handler: async () => {
        await parked;
        return new Response("late");
      },
    });
    const busy = await rawClient(port);
    await busy.write(GET);
    await accepted(server, 1);
    await new Promise((r) => setTimeout(r, 20));
    const refused = await rawClient(port);
    await refused.closedWithin(2000);
    assert.equal(busy.closed(), false);
    release();
    await busy.until("late");
    busy.close();
    await server.shutdown();
  });

  Deno.test(name + ".shutdown() lets an in-flight request finish, then closes", async () => {
    let release!: () => void;
    const parked = new Promise<void>((r) => release = r);
    const { server, port } = start({
      handler: async () => {
        await parked;
        return new Response("finished");
      },
    });
    const idle = await rawClient(port);
    const busy = await rawClient(port);
    await busy.write(GET);
    await accepted(server, 2);
    await new Promise((r) => setTimeout(r, 20));
    const stopped = server.shutdown();
    await idle.closedWithin(2000);
    assert.equal(busy.closed(), false);
    release();
    await busy.until("finished");
    await stopped;
    await busy.closedWithin(2000);
  });

  Deno.test(name + " drops a body cut with StreamCut and logs it as info, not error", async () => {
    const lines: { level: string; msg: string }[] = [];
    const { server, port } = start({
      log: (level, msg) => void lines.push({ level, msg }),
      handler: () =>
        new Response(
          new ReadableStream({
            start(c) {
              c.enqueue(new TextEncoder().encode("part"));
              setTimeout(() => c.error(new StreamCut("the sandbox died")), 20);
            },
          }),
        ),
    });
    const res = await fetch(`http://127.0.0.1:${port}/`);
    await assert.rejects(res.text(), /error reading a body from connection/);
    const end = Date.now() + 2000;
    while (!lines.some((l) => l.msg.includes("cut off")) && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.deepEqual(lines.filter((l) => l.level !== "info"), []);
    assert.ok(lines.some((l) => l.msg === "a streamed answer was cut off"), JSON.stringify(lines));
    await server.shutdown();
  });

  Deno.test(name + " with tls serves HTTPS a client trusting the CA accepts", async () => {
    const certs = await makeCertificates(["localhost"]);
    const server = serveGuarded({
      upgrades,
      engine,
      hostname: "127.0.0.1",
      port: 0,
      tls: { cert: certs.cert, key: certs.key },
      handler: (r) => new Response(`secure ${new URL(r.url).protocol}`),
    });
    const client = Deno.createHttpClient({ caCerts: [certs.ca] });
    try {
      const res = await fetch(`https://localhost:${server.addr.port}/`, { client });
      assert.equal(await res.text(), "secure https:");
      // Plain HTTP on the TLS port is not served.
      await assert.rejects(() => fetch(`http://127.0.0.1:${server.addr.port}/`));
      // Nor is a client that does not trust the CA.
      await assert.rejects(() => fetch(`https://localhost:${server.addr.port}/`));
    } finally {
      client.close();
      await server.shutdown();
      await Deno.remove(certs.dir, { recursive: true });
    }
  });
}

guardSuite(false);
guardSuite(true);
guardSuite(false, "bytes");

async function echoOnce(port: number): Promise<string> {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/`);
  const closed = new Promise((r) => ws.addEventListener("close", r));
  try {
    return await new Promise<string>((resolve, reject) => {
      ws.onopen = () => ws.send("hi");
      ws.onmessage = (e) => resolve(e.data);
      ws.onerror = (e) => reject(new Error((e as ErrorEvent).message));
      ws.onclose = (e) => reject(new Error(`closed (${e.code}) before an echo`));
    });
  } finally {
    ws.close();
    await closed;
  }
}

const echoing = (r: Request) => {
  const { socket, response } = Deno.upgradeWebSocket(r);
  socket.onmessage = (e) => socket.send(`echo ${e.data}`);
  return response;
};

Deno.test("serveGuarded({ upgrades }) keeps an upgraded WebSocket open: frames go both ways", async () => {
  const server = serveGuarded({ hostname: "127.0.0.1", port: 0, upgrades: true, handler: echoing });
  try {
    assert.equal(await echoOnce(server.addr.port), "echo hi");
    assert.equal(await echoOnce(server.addr.port), "echo hi", "and again on a new connection");
  } finally {
    await server.shutdown();
  }
});

Deno.test("serveGuarded() without upgrades answers a WebSocket upgrade 501, saying why", async () => {
  const server = serveGuarded({ hostname: "127.0.0.1", port: 0, handler: echoing });
  try {
    const res = await fetch(`http://127.0.0.1:${server.addr.port}/`, {
      headers: {
        connection: "Upgrade",
        upgrade: "websocket",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
      },
    });
    assert.equal(res.status, 501);
    assert.match(await res.text(), /takes no WebSocket upgrades/);
  } finally {
    await server.shutdown();
  }
});

Deno.test("serveGuarded({ upgrades }) sends an answer as it is: no compression unasked", async () => {
  const text = JSON.stringify({ filler: "x".repeat(4000) });
  const server = serveGuarded({
    hostname: "127.0.0.1",
    port: 0,
    upgrades: true,
    handler: () => new Response(text, { headers: { "content-type": "application/json" } }),
  });
  try {
    const res = await fetch(`http://127.0.0.1:${server.addr.port}/`, {
      headers: { "accept-encoding": "gzip, br" },
    });
    assert.equal(res.headers.get("content-encoding"), null);
    assert.equal(res.headers.get("content-length"), String(text.length));
    assert.equal(await res.text(), text);
  } finally {
    await server.shutdown();
  }
});
