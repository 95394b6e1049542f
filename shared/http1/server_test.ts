/**
 * The bytes engine (`server.ts`), black-box: raw bytes over loopback to
 * `serveGuarded({ engine: "bytes" })`: bodies, framing, HTTP/1.0, Expect, early answers, hang-ups
 * and URLs. Its refusals are `server_refusals_test.ts`.
 */
import assert from "node:assert/strict";
import { type BytesLane, sentUrl } from "./server.ts";
import { createH1Client } from "./client.ts";
import {
  answers,
  deferred,
  enc,
  firstHead,
  GET,
  hasHeader,
  ok,
  sleep,
  within,
  withServer,
} from "./_server_fixtures_test.ts";

const echo = async (request: Request) => new Response(await request.text());

/** A GET's answer on a fresh connection that the server then closes: its head and what followed. */
async function answerThenClose(
  connect: Parameters<Parameters<typeof withServer>[1]>[0]["connect"],
): Promise<{ head: string; body: string }> {
  const c = await connect();
  await c.write(GET);
  await c.closedWithin(2000);
  const text = c.received();
  const head = firstHead(text);
  return { head, body: text.slice(head.length) };
}

Deno.test("bytes engine: a sized POST body reaches the handler intact", async () => {
  await withServer(echo, async ({ connect }) => {
    const c = await connect();
    const body = "hello, sized\r\n\r\nworld";
    await c.write(`POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n`);
    await sleep(10);
    await c.write(body);
    await c.until(body);
    assert.match(c.received(), /^HTTP\/1\.1 200 /);
    assert.ok(c.received().endsWith(`\r\n\r\n${body}`), c.received());
    assert.ok(hasHeader(firstHead(c.received()), `content-length: ${body.length}`));
  });
});

Deno.test("bytes engine: equal Content-Lengths, twice or as a list, are one length", async () => {
  await withServer(echo, async ({ connect }) => {
    const c = await connect();
    await c.write(
      "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nfirst",
    );
    await c.until("first");
    await c.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6, 6\r\n\r\nsecond");
    await c.until((t) => answers(t) === 2 && t.endsWith("second"));
    assert.equal(c.received().match(/HTTP\/1\.1 200 /g)?.length, 2, c.received());
  });
});

Deno.test("bytes engine: a chunked POST body (extension, trailer) reaches the handler intact", async () => {
  let trailerSeen = "";
  await withServer(async (request) => {
    const text = await request.text();
    trailerSeen = request.headers.get("x-trailer") ?? "";
    return new Response(text);
  }, async ({ connect }) => {
    const c = await connect();
    await c.write("POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    await c.write("5;x=y\r\nhello\r\n");
    await sleep(10);
    await c.write("1\r\n,\r\n");
    await c.write("B\r\n chunked!\r\n\r\n0\r\nX-Trailer: t\r\n\r\n");
    await c.until("chunked!\r\n");
    const text = c.received();
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.ok(text.endsWith("\r\n\r\nhello, chunked!\r\n"), JSON.stringify(text));
    assert.equal(trailerSeen, "", "a trailer is not a header");
    // The connection serves on after a chunked body.
    await c.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    await c.until((t) => answers(t) === 2 && t.endsWith("abc"));
  });
});

const badChunked: [string, string][] = [
  ["a size that is not hex", "zz\r\nhello\r\n0\r\n\r\n"],
  ["a size past 2^53", "fffffffffffffff\r\nhello\r\n0\r\n\r\n"],
  ["no CRLF after a chunk's data", "5\r\nhelloXX\r\n0\r\n\r\n"],
];

for (const [what, body] of badChunked) {
  Deno.test(`bytes engine: a chunked body with ${what} fails the read and closes`, async () => {
    const read = deferred<unknown>();
    await withServer(async (request) => {
      try {
        read.resolve(`read: ${await request.text()}`);
      } catch (error) {
        read.resolve(error);
      }
      return new Response("handled");
    }, async ({ connect }) => {
      const c = await connect();
      await c.write(`POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${body}`);
      const outcome = await within(read.promise, 2000, "the handler's body read");
      assert.ok(outcome instanceof Error, `the body read did not fail: ${outcome}`);
      await c.closedWithin(2000);
    });
  });
}

// --- Pipelining. ---

Deno.test("bytes engine: pipelined requests are answered in order", async () => {
  await withServer(async (request) => {
    const path = new URL(request.url).pathname;
    if (path === "/slow") await sleep(30);
    const body = request.body === null ? "" : await request.text();
    return new Response(`${path}[${body}]`);
  }, async ({ connect }) => {
    const c = await connect();
    await c.write(
      "GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    await c.until((t) => answers(t) === 2 && t.includes("/fast[]"));
    const text = c.received();
    assert.ok(text.indexOf("/slow[]") < text.indexOf("/fast[]"), text);
    // With a body in between.
    const d = await connect();
    await d.write(
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" +
        "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n" +
        "GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    await d.until((t) => answers(t) === 3 && t.includes("/c[]"));
    const three = d.received();
    const at = ["/a[abc]", "/b[de]", "/c[]"].map((s) => three.indexOf(s));
    assert.ok(at[0] >= 0 && at[0] < at[1] && at[1] < at[2], three);
  });
});

// --- Bodiless answers. ---

Deno.test("bytes engine: a HEAD answer has its head and no body bytes", async () => {
  await withServer(() => new Response("hello"), async ({ connect }) => {
    const c = await connect();
    await c.write("HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
    await c.until("\r\n\r\n");
    await sleep(30);
    const head = firstHead(c.received());
    assert.equal(c.received(), head, "bytes after a HEAD answer's head");
    assert.ok(!hasHeader(head, "transfer-encoding"), head);
    await c.write(GET);
    await c.until((t) => answers(t) === 2 && t.endsWith("hello"));
    assert.ok(c.received().slice(head.length).startsWith("HTTP/1.1 200 "), c.received());
  });
});

Deno.test("bytes engine: 204 and 304 answers carry no body and no framing", async () => {
  await withServer((request) => {
    const path = new URL(request.url).pathname;
    if (path === "/204") return new Response(null, { status: 204 });
    if (path === "/304") return new Response(null, { status: 304, headers: { etag: '"v1"' } });
    return new Response("after");
  }, async ({ connect }) => {
    const c = await connect();
    let seen = 0;
    for (const status of [204, 304]) {
      await c.write(`GET /${status} HTTP/1.1\r\nHost: x\r\n\r\n`);
      await c.until((t) => t.slice(seen).includes("\r\n\r\n"));
      await sleep(20);
      const rest = c.received().slice(seen);
      const head = firstHead(rest);
      assert.match(head, new RegExp(`^HTTP/1\\.1 ${status} `));
      assert.equal(rest, head, `bytes after a ${status}'s head`);
      assert.ok(!hasHeader(head, "content-length"), head);
      assert.ok(!hasHeader(head, "transfer-encoding"), head);
      assert.ok(!hasHeader(head, "connection"), head);
      seen += head.length;
    }
    await c.write(GET);
    await c.until("after");
    assert.ok(c.received().slice(seen).startsWith("HTTP/1.1 200 "), c.received());
    assert.equal(c.closed(), false);
  });
});

// --- HTTP/1.0. ---

Deno.test("bytes engine: an HTTP/1.0 request is answered, then the connection closed", async () => {
  let url = "";
  await withServer((request) => {
    url = request.url;
    return new Response("ten");
  }, async ({ connect }) => {
    const c = await connect();
    await c.write("GET /ten HTTP/1.0\r\n\r\n");
    await c.closedWithin(2000);
    const text = c.received();
    assert.match(text, /^HTTP\/1\.1 200 /);
    const head = firstHead(text);
    assert.ok(hasHeader(head, "connection: close"), head);
    assert.ok(hasHeader(head, "content-length: 3"), head);
    assert.equal(text.slice(head.length), "ten");
    assert.equal(url, "http://localhost/ten", "an HTTP/1.0 request without Host");
  });
});

Deno.test("bytes engine: HTTP/1.0 with Connection: keep-alive stays open", async () => {
  await withServer(() => new Response("kept"), async ({ connect }) => {
    const c = await connect();
    const request = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    await c.write(request);
    await c.until("kept");
    assert.match(c.received(), /^HTTP\/1\.1 200 /);
    assert.ok(!hasHeader(firstHead(c.received()), "connection: close"));
    await c.write(request);
    await c.until((t) => answers(t) === 2 && t.endsWith("kept"));
    assert.equal(c.closed(), false);
  });
});

/** A body of `parts`, each enqueued after a pause; `gate` (when given) opens before the first. */
function streamed(parts: string[], gate?: Promise<void>): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    async start(controller) {
      if (gate !== undefined) await within(gate, 3000, "the test's gate");
      for (const part of parts) {
        controller.enqueue(enc(part));
        await sleep(10);
      }
      controller.close();
    },
  });
}

Deno.test("bytes engine: a streamed answer to HTTP/1.0 is unframed and ends with the close", async () => {
  await withServer(() => new Response(streamed(["one ", "two ", "three"])), async ({ connect }) => {
    const c = await connect();
    await c.write("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    await c.closedWithin(2000);
    const text = c.received();
    const head = firstHead(text);
    assert.match(head, /^HTTP\/1\.1 200 /);
    assert.ok(!hasHeader(head, "transfer-encoding"), head);
    assert.ok(!hasHeader(head, "content-length"), head);
    assert.ok(hasHeader(head, "connection: close"), head);
    assert.equal(text.slice(head.length), "one two three");
  });
});

// --- HTTP/1.1 answers. ---

Deno.test("bytes engine: a streamed answer is chunked, its head sent before its first chunk", async () => {
  const gate = deferred();
  await withServer(
    () => new Response(streamed(["hello", " world"], gate.promise)),
    async ({ connect }) => {
      const c = await connect();
      try {
        await c.write(GET);
        await c.until("\r\n\r\n");
        const head = firstHead(c.received());
        assert.match(head, /^HTTP\/1\.1 200 /);
        assert.ok(hasHeader(head, "transfer-encoding: chunked"), head);
        assert.ok(!hasHeader(head, "content-length"), head);
        assert.equal(c.received(), head, "body bytes before the handler made any");
        gate.resolve();
        await c.until("0\r\n\r\n");
        assert.equal(c.received().slice(head.length), "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
        await c.write(GET);
        await c.until((t) => answers(t) === 2);
      } finally {
        gate.resolve();
      }
    },
  );
});

Deno.test("bytes engine: an answer header's octets past 0x7f go out as themselves, not as UTF-8", async () => {
  // A Headers value is a ByteString: "\u00e9" is the one byte 0xe9 on the wire.
  await withServer(
    () => new Response("ok", { headers: { "x-name": "caf\u00e9" } }),
    async ({ connect }) => {
      const c = await connect();
      await c.write(GET);
      await c.until("\r\n\r\nok");
      assert.ok(hasHeader(firstHead(c.received()), "x-name: caf\u00e9"), c.received());
    },
  );
});

Deno.test("bytes engine: a fixed answer is sized: content-length, no transfer-encoding", async () => {
  await withServer(() => new Response("hello"), async ({ connect }) => {
    const c = await connect();
    await c.write(GET);
    await c.until("hello");
    const text = c.received();
    const head = firstHead(text);
    assert.match(head, /^HTTP\/1\.1 200 OK\r\n/);
    assert.ok(hasHeader(head, "content-length: 5"), head);
    assert.ok(!hasHeader(head, "transfer-encoding"), head);
    assert.ok(hasHeader(head, "date"), head);
    assert.equal(text.slice(head.length), "hello");
  });
});

// --- Expect: 100-continue. ---

Deno.test("bytes engine: 100 Continue goes out when the handler first reads, then the answer", async () => {
  const called = deferred();
  const gate = deferred();
  await withServer(async (request) => {
    called.resolve();
    await within(gate.promise, 3000, "the test's gate");
    return new Response(`got ${await request.text()}`);
  }, async ({ connect }) => {
    const c = await connect();
    try {
      await c.write(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
      );
      await within(called.promise, 2000, "the handler's call");
      await sleep(50);
      assert.equal(c.received(), "", "sent before the handler read the body");
      gate.resolve();
      await c.until("\r\n\r\n");
      await sleep(20);
      assert.equal(c.received(), "HTTP/1.1 100 Continue\r\n\r\n");
      await c.write("hello");
      await c.until("got hello");
      assert.match(c.received(), /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /);
    } finally {
      gate.resolve();
    }
  });
});

Deno.test("bytes engine: a 413 to an Expect: 100-continue unread: no 100, answer, close", async () => {
  await withServer(
    () => new Response("too large", { status: 413 }),
    async ({ connect }) => {
      const c = await connect();
      await c.write(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n",
      );
      await c.closedWithin(2000);
      const text = c.received();
      assert.match(text, /^HTTP\/1\.1 413 /, "no 100 Continue before the answer");
      assert.ok(!text.includes("100 Continue"), text);
      assert.ok(text.endsWith("too large"), text);
      assert.ok(hasHeader(firstHead(text), "connection: close"), text);
    },
  );
});

Deno.test("bytes engine: an early 413 to a 4 MiB body is received, then the connection serves on", async () => {
  const size = 4 * 1024 * 1024;
  await withServer((request) => {
    if (request.method === "POST") return new Response("too large", { status: 413 });
    return new Response("next");
  }, async ({ connect }) => {
    const c = await connect();
    await c.write(`POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: ${size}\r\n\r\n`);
    const sending = c.write(new Uint8Array(size).fill(97));
    sending.catch(() => {});
    await c.until("too large", 5000);
    assert.match(c.received(), /^HTTP\/1\.1 413 /);
    await within(sending, 5000, "sending the 4 MiB body");
    await c.write(GET);
    await c.until("next", 5000);
    assert.equal(answers(c.received()), 2);
    assert.equal(c.closed(), false);
  });
});

// --- Hang-ups. ---

/** A handler that hands over its request's signal, then answers at its abort (or after 3 s). */
function waitingHandler(seen: (signal: AbortSignal) => void, readBody: boolean) {
  return async (request: Request) => {
    if (readBody) await request.text();
    seen(request.signal);
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 3000);
      request.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve();
      });
    });
    return new Response("gone");
  };
}

/** Resolves true once `signal` aborts. */
const abortOf = (signal: AbortSignal) =>
  new Promise<true>((r) => {
    if (signal.aborted) r(true);
    signal.addEventListener("abort", () => r(true));
  });

Deno.test("bytes engine: a client that hangs up after a whole GET aborts request.signal", async () => {
  const seen = deferred<AbortSignal>();
  await withServer(waitingHandler(seen.resolve, false), async ({ connect }) => {
    const c = await connect();
    await c.write(GET);
    const signal = await within(seen.promise, 2000, "the handler's call");
    await sleep(20);
    assert.equal(signal.aborted, false, "aborted before the client left");
    await c.close();
    await within(abortOf(signal), 2000, "request.signal's abort");
  });
});

Deno.test("bytes engine: a client that hangs up after a POST body read aborts request.signal", async () => {
  const seen = deferred<AbortSignal>();
  await withServer(waitingHandler(seen.resolve, true), async ({ connect }) => {
    const c = await connect();
    await c.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    const signal = await within(seen.promise, 2000, "the handler's body read");
    await sleep(20);
    assert.equal(signal.aborted, false, "aborted before the client left");
    await c.close();
    await within(abortOf(signal), 2000, "request.signal's abort");
  });
});

// --- Connection: close. ---

Deno.test("bytes engine: Connection: close is answered with connection: close, then closed", async () => {
  await withServer(ok, async ({ connect }) => {
    const c = await connect();
    await c.write("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    await c.closedWithin(2000);
    const text = c.received();
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.ok(hasHeader(firstHead(text), "connection: close"), text);
    assert.ok(text.endsWith("ok"), text);
    assert.equal(c.wasReset(), false, "reset instead of closed");
  });
});

// --- Failures. ---

Deno.test("bytes engine: a handler that throws gets serveGuarded's default 500", async () => {
  const logged: string[] = [];
  await withServer(() => {
    throw new Error("the handler's bug");
  }, async ({ connect }) => {
    const c = await connect();
    await c.write(GET);
    await c.until("log has the details");
    assert.match(c.received(), /^HTTP\/1\.1 500 /);
    assert.ok(c.received().endsWith("Internal error: the server's log has the details"));
  }, { log: (_level, msg) => void logged.push(msg) });
  assert.ok(logged.includes("unexpected error answering a request"), JSON.stringify(logged));
});

Deno.test("bytes engine: an answer body that errors midway closes the connection unterminated", async () => {
  const logged: string[] = [];
  await withServer(() =>
    new Response(
      new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(enc("part"));
          setTimeout(() => controller.error(new Error("the source broke")), 20);
        },
      }),
    ), async ({ connect }) => {
    const { head, body } = await answerThenClose(connect);
    assert.ok(hasHeader(head, "transfer-encoding: chunked"), head);
    assert.equal(body, "4\r\npart\r\n", "a chunked terminator was sent");
  }, { log: (_level, msg) => void logged.push(msg) });
  assert.ok(logged.includes("unexpected error answering a request"), JSON.stringify(logged));
});

for (
  const [framing, answer] of [
    ["sized", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart"],
    ["chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npart\r\n"],
  ]
) {
  Deno.test(`bytes engine: an upstream ${framing} answer cut mid-body is no unexpected error, and leaks nothing`, async () => {
    // The server behind (a node whose sandbox was killed mid-stream): a head, part of the
    // body, then its connection closes.
    const upstream = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const served = (async () => {
      const conn = await upstream.accept();
      await conn.read(new Uint8Array(4096));
      await conn.write(enc(answer));
      conn.close();
    })();
    const client = createH1Client();
    const logged: [string, string][] = [];
    try {
      await withServer(
        () => client.fetch(`http://127.0.0.1:${upstream.addr.port}/`),
        async ({ connect }) => {
          const { head, body } = await answerThenClose(connect);
          assert.match(head, /^HTTP\/1\.1 200 /, "the precondition: the head went out");
          assert.ok(body.includes("part"), body);
          assert.doesNotMatch(body, /Internal error|Bad gateway/, "nothing after the cut");
        },
        { log: (level, msg, f) => void logged.push([level, `${msg} ${JSON.stringify(f)}`]) },
      );
      await served;
      assert.deepEqual(logged.filter(([level]) => level === "error"), []);
      assert.ok(
        logged.some(([level, msg]) =>
          level === "debug" && msg.startsWith("an upstream closed its answer before it ended")
        ),
        JSON.stringify(logged),
      );
      assert.equal(client.open, 0, "the upstream's connection is released");
    } finally {
      client.close();
      upstream.close();
    }
  });
}

Deno.test("bytes engine: a body past its declared length: the length goes out sized, then the close", async () => {
  // The whole declared body comes in the first piece, then one byte too many.
  await withServer(() =>
    new Response(
      new ReadableStream<Uint8Array>({
        pull(controller) {
          controller.enqueue(enc("hello"));
          controller.enqueue(enc("!"));
          controller.close();
        },
      }),
      { headers: { "content-length": "5" } },
    ), async ({ connect }) => {
    const { head, body } = await answerThenClose(connect);
    assert.ok(hasHeader(head, "content-length: 5"), head);
    assert.equal(body, "hello", "the extra byte was not sent");
  }, { log: () => {} });
});

Deno.test("bytes engine: a body that ends short of its declared length closes the connection", async () => {
  await withServer(
    () => new Response(enc("hel"), { headers: { "content-length": "5" } }),
    async ({ connect }) => {
      const { head, body } = await answerThenClose(connect);
      assert.ok(hasHeader(head, "content-length: 5"), head);
      // The three bytes there are, then the close: the client sees the answer cut short.
      assert.equal(body, "hel");
    },
    { log: () => {} },
  );
});

// --- The request the handler sees. ---

Deno.test("bytes engine: the request URL is http://<Host><target>; sentUrl keeps it as sent", async () => {
  await withServer(
    (request) => Response.json({ url: request.url, sent: sentUrl(request) }),
    async ({ connect }) => {
      const cases: [string, string, string][] = [
        ["/x/y?z=1", "http://example.test:8080/x/y?z=1", "http://example.test:8080/x/y?z=1"],
        ["/a/../b", "http://example.test:8080/b", "http://example.test:8080/a/../b"],
        ["http://other.test/p", "http://other.test/p", "http://other.test/p"],
      ];
      for (const [target, url, sent] of cases) {
        const c = await connect();
        await c.write(
          `GET ${target} HTTP/1.1\r\nHost: example.test:8080\r\nConnection: close\r\n\r\n`,
        );
        await c.closedWithin(2000);
        const text = c.received();
        assert.deepEqual(JSON.parse(text.slice(firstHead(text).length)), { url, sent }, target);
      }
    },
  );
});

Deno.test("bytes engine: a WebSocket upgrade request is answered 501", async () => {
  let served = 0;
  await withServer(() => {
    served++;
    return ok();
  }, async ({ connect }) => {
    const c = await connect();
    await c.write(
      "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    await c.until("upgrades");
    assert.match(c.received(), /^HTTP\/1\.1 501 /);
    assert.match(c.received(), /takes no WebSocket upgrades/);
  });
  assert.equal(served, 0, "the app's handler saw the upgrade");
});

Deno.test("bytes engine: a lane's head bytes survive a body that arrives in a later read", async () => {
  // The head is consumed whole by its read, so the buffer holds nothing live when the body is
  // read: the body must land beside the head, not over it (the lane copies the head's raw bytes
  // into the node's request after the body has come).
  const headRead = deferred();
  const head = "POST /lane HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n" +
    "Content-Length: 32\r\n\r\n";
  const body = "B".repeat(32);
  const lane: BytesLane<true> = {
    maxBodyBytes: 1024,
    claim: () => {
      headRead.resolve();
      return true;
    },
    serve: (ex) => {
      const raw = new TextDecoder().decode(ex.head.raw);
      return Promise.resolve(new Response(`${raw}|${new TextDecoder().decode(ex.body)}`));
    },
  };
  await withServer(ok, async ({ connect }) => {
    const c = await connect();
    await c.write(head);
    await within(headRead.promise, 2000, "the lane's claim of the head");
    await c.write(body);
    await c.until(`|${body}`);
    const text = c.received();
    assert.ok(text.endsWith(`\r\n\r\n${head}|${body}`), JSON.stringify(text));
  }, { lane });
});
