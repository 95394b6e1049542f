import assert from "node:assert/strict";
import { createH1Client, type H1Client } from "./client.ts";
import { HangUpWatch } from "../hang_up_watch.ts";

function serve(handler: (r: Request) => Response | Promise<Response>) {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
  return { server, url: `http://127.0.0.1:${server.addr.port}` };
}

/** A raw TCP server answering every connection with `answer`, then closing. */
function rawServer(answer: string) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const done = (async () => {
    for await (const conn of listener) {
      const buf = new Uint8Array(4096);
      await conn.read(buf);
      await conn.write(new TextEncoder().encode(answer)).catch(() => {});
      conn.close();
    }
  })().catch(() => {});
  return {
    url: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    close: async () => {
      listener.close();
      await done;
    },
  };
}

Deno.test("createH1Client() keeps one connection alive across sequential requests", async () => {
  const { server, url } = serve(async (r) => new Response(`got ${await r.text()}`));
  const client = createH1Client();
  try {
    for (let i = 0; i < 5; i++) {
      const res = await client.fetch(`${url}/x?i=${i}`, { method: "POST", body: `b${i}` });
      assert.equal(res.status, 200);
      assert.equal(await res.text(), `got b${i}`);
    }
    assert.equal(client.open, 1);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() bounds the pool: the next request waits for a free connection", async () => {
  let inFlight = 0, most = 0;
  const { server, url } = serve(async () => {
    most = Math.max(most, ++inFlight);
    await new Promise((r) => setTimeout(r, 20));
    inFlight--;
    return new Response("ok");
  });
  const client = createH1Client({ maxConnections: 2 });
  try {
    const answers = await Promise.all(
      Array.from({ length: 6 }, () => client.fetch(url).then((r) => r.text())),
    );
    assert.deepEqual(answers, Array(6).fill("ok"));
    assert.equal(most, 2);
    assert.equal(client.open, 2);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() closes idle connections after idleTimeoutMs", async () => {
  const { server, url } = serve(() => new Response("ok"));
  const client = createH1Client({ idleTimeoutMs: 60 });
  try {
    await (await client.fetch(url)).text();
    assert.equal(client.open, 1);
    await new Promise((r) => setTimeout(r, 250));
    assert.equal(client.open, 0);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() streams a request body out chunked and a chunked answer in", async () => {
  const { server, url } = serve((r) => {
    if (r.method === "PUT") assert.equal(r.headers.get("transfer-encoding"), "chunked");
    // Echo as it comes: the answer is chunked too.
    return new Response(r.body);
  });
  const client = createH1Client();
  try {
    const parts = ["alpha", "beta", "gamma"];
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        const p = parts.shift();
        if (p === undefined) c.close();
        else c.enqueue(new TextEncoder().encode(p));
      },
    });
    const res = await client.fetch(url, { method: "PUT", body });
    assert.equal(await res.text(), "alphabetagamma");
    // The connection went back to the pool once both bodies were done.
    const again = await client.fetch(url, { method: "POST", body: "x" });
    assert.equal(await again.text(), "x");
    assert.equal(client.open, 1);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() frames chunks of any size in turn, each byte as sent", async () => {
  // The chunk framing reuses one buffer: a chunk smaller or larger than the last must still go
  // out whole and unmixed.
  const { server, url } = serve(async (r) => new Response(await r.arrayBuffer()));
  const client = createH1Client();
  try {
    const sizes = [100_000, 10, 300_000, 7, 65_536];
    const chunks = sizes.map((n, i) => new Uint8Array(n).fill(97 + i));
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        const next = chunks.shift();
        if (next === undefined) c.close();
        else c.enqueue(next.slice());
      },
    }, { highWaterMark: 0 });
    const res = await client.fetch(url, { method: "PUT", body });
    const got = new Uint8Array(await res.arrayBuffer());
    assert.equal(got.length, sizes.reduce((a, b) => a + b, 0));
    let at = 0;
    sizes.forEach((n, i) => {
      const part = got.subarray(at, at + n);
      assert.ok(part.every((b) => b === 97 + i), `chunk ${i} (${n} bytes) came back mixed`);
      at += n;
    });
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() hands out answer chunks that stay as read while later ones arrive", async () => {
  // Reads go into the room after the chunks handed out: a chunk kept by the reader must never
  // be overwritten by a later read, sized answers and chunked ones alike.
  const parts = Array.from({ length: 40 }, (_, i) => new Uint8Array(50_000).fill(i * 7 % 251));
  const expected = new Uint8Array(parts.length * 50_000);
  parts.forEach((p, i) => expected.set(p, i * 50_000));
  const { server, url } = serve((r) => {
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        for (const p of parts) c.enqueue(p.slice());
        c.close();
      },
    });
    return new Response(body, {
      headers: r.method === "HEAD" ? {} : { "content-length": String(expected.length) },
    });
  });
  const client = createH1Client();
  try {
    for (const method of ["GET", "POST"]) {
      const res = await client.fetch(url, { method, body: method === "POST" ? "x" : undefined });
      const kept: Uint8Array[] = [];
      for await (const chunk of res.body!) kept.push(chunk); // held, not copied
      const got = new Uint8Array(kept.reduce((a, c) => a + c.length, 0));
      let at = 0;
      for (const c of kept) {
        got.set(c, at);
        at += c.length;
      }
      assert.equal(got.length, expected.length);
      assert.ok(got.every((b, i) => b === expected[i]), `a kept chunk was overwritten (${method})`);
    }
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() sends and reads header octets past 0x7f as themselves, not as UTF-8", async () => {
  // A Headers value is a ByteString: "\u00e9" is the one byte 0xe9 on the wire, both ways.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let sent = new Uint8Array(0);
  const done = (async () => {
    const conn = await listener.accept();
    const buf = new Uint8Array(4096);
    const n = await conn.read(buf);
    sent = buf.slice(0, n ?? 0);
    const answer = "HTTP/1.1 200 OK\r\nx-name: caf\u00e9\r\ncontent-length: 2\r\n\r\nok";
    await conn.write(Uint8Array.from(answer, (c) => c.charCodeAt(0)));
    conn.close();
  })();
  const client = createH1Client();
  try {
    const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}/`;
    const res = await client.fetch(url, { headers: new Headers({ "x-name": "caf\u00e9" }) });
    assert.equal(res.headers.get("x-name"), "caf\u00e9");
    assert.equal(await res.text(), "ok");
    await done;
    const line = String.fromCharCode(...sent).split("\r\n").find((l) => l.startsWith("x-name:"));
    assert.equal(line, "x-name: caf\u00e9", "one byte 0xe9, not the two of UTF-8");
    // Refused before any connection: port 9 would refuse one, with another message.
    await assert.rejects(
      client.fetch("http://127.0.0.1:9/", { headers: { "x-name": "\u20ac" } }),
      /Cannot send header 'x-name': it holds a character past \\xff/,
    );
  } finally {
    client.close();
    listener.close();
  }
});

Deno.test("createH1Client() refuses a head past maxHeaderBytes", async () => {
  const raw = rawServer(`HTTP/1.1 200 OK\r\nx-big: ${"a".repeat(4000)}\r\n\r\n`);
  const client = createH1Client({ maxHeaderBytes: 1024 });
  try {
    await assert.rejects(client.fetch(raw.url), /head is longer than 1024 bytes/);
    assert.equal(client.open, 0);
  } finally {
    client.close();
    await raw.close();
  }
});

Deno.test("createH1Client() refuses an answer whose Content-Length is no length, both ways", async () => {
  const raw = rawServer("HTTP/1.1 200 OK\r\ncontent-length: 12x\r\n\r\nabc");
  const client = createH1Client();
  try {
    await assert.rejects(client.fetch(raw.url), /bad content-length '12x'/);
    const request = new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\n\r\n");
    await assert.rejects(client.sendBytes(raw.url, request, null), /bad content-length '12x'/);
    assert.equal(client.open, 0, "neither connection was kept");
  } finally {
    client.close();
    await raw.close();
  }
});

Deno.test("createH1Client() reads a body that ends with the connection, and never reuses it", async () => {
  const raw = rawServer("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end");
  const client = createH1Client();
  try {
    const res = await client.fetch(raw.url);
    assert.equal(await res.text(), "until the end");
    assert.equal(client.open, 0);
  } finally {
    client.close();
    await raw.close();
  }
});

Deno.test("createH1Client() aborts: the node sees the hang-up, the caller the reason", async () => {
  let sawAbort!: () => void;
  const aborted = new Promise<void>((r) => sawAbort = r);
  const { server, url } = serve((r) =>
    new Promise<Response>((resolve) => {
      r.signal.addEventListener("abort", () => {
        sawAbort();
        resolve(new Response(null, { status: 499 }));
      });
    })
  );
  const client = createH1Client();
  try {
    const ac = new AbortController();
    const pending = client.fetch(url, { method: "POST", body: "{}", signal: ac.signal });
    await new Promise((r) => setTimeout(r, 50));
    ac.abort(new Error("client gone"));
    await assert.rejects(pending, /client gone/);
    await aborted;
    assert.equal(client.open, 0);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("sendBytes() ends on its Cancel's abort: the node sees the hang-up, the caller the reason", async () => {
  let sawAbort!: () => void;
  const aborted = new Promise<void>((r) => sawAbort = r);
  const { server, url } = serve((r) =>
    new Promise<Response>((resolve) => {
      // Bounded, so a failing run ends: the server's shutdown waits for this answer.
      const timer = setTimeout(() => resolve(new Response(null, { status: 504 })), 3000);
      r.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        sawAbort();
        resolve(new Response(null, { status: 499 }));
      });
    })
  );
  const client = createH1Client();
  // A watch entry is the Cancel the bytes lane passes: no AbortSignal unless a wait needs one.
  const entry = new HangUpWatch({ tickMs: 60_000 }).watch(
    { signal: new AbortController().signal },
    { nodeId: "n", endpoint: url },
  );
  try {
    const request = new TextEncoder().encode(
      "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
    );
    const pending = client.sendBytes(url, request, entry);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(client.open, 1, "the request is on a connection");
    entry.abort(new Error("client gone"));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error("the exchange did not end within 2 s")), 2000);
    });
    await assert.rejects(Promise.race([pending, late]), /client gone/);
    clearTimeout(timer);
    await aborted;
    assert.equal(client.open, 0);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("sendBytes(): a whole body is copied out and its read buffer serves the next answer", async () => {
  const { server, url } = serve((r) => new Response(`answer to ${new URL(r.url).pathname}`));
  const client = createH1Client();
  try {
    const seen: string[] = [];
    for (const path of ["/a", "/bb", "/ccc"]) {
      const request = new TextEncoder().encode(`GET ${path} HTTP/1.1\r\nhost: x\r\n\r\n`);
      const answer = await client.sendBytes(url, request, null);
      const n = answer.wholeLength();
      assert.ok(n > 0, "a small sized answer arrives whole with its head");
      const into = new Uint8Array(n + 2);
      answer.copyWhole(into, 2);
      seen.push(new TextDecoder().decode(into.subarray(2)));
      assert.equal(await answer.next(), null, "nothing is left to read");
    }
    assert.deepEqual(seen, ["answer to /a", "answer to /bb", "answer to /ccc"]);
    assert.equal(client.open, 1, "one connection served all three");
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("sendBytes(): an answer taken as sent keeps its bytes while the connection serves the next", async () => {
  const { server, url } = serve((r) => new Response(`answer to ${new URL(r.url).pathname}`));
  const client = createH1Client();
  try {
    const taken: Uint8Array[] = [];
    for (const path of ["/a", "/bb", "/ccc"]) {
      const request = new TextEncoder().encode(`GET ${path} HTTP/1.1\r\nhost: x\r\n\r\n`);
      const answer = await client.sendBytes(url, request, null);
      assert.ok(answer.wholeLength() > 0, "a small sized answer arrives whole with its head");
      // Kept, as a slow client's write keeps it, while the next answers are read.
      taken.push(answer.asSent());
      assert.equal(await answer.next(), null, "nothing is left to read");
    }
    const text = taken.map((b) => new TextDecoder().decode(b));
    for (const [i, path] of ["/a", "/bb", "/ccc"].entries()) {
      assert.match(text[i], /^HTTP\/1\.1 200 OK\r\n/, "the head, as the node sent it");
      assert.ok(text[i].endsWith(`\r\n\r\nanswer to ${path}`), `${path}: ${text[i]}`);
    }
    assert.equal(client.open, 1, "one connection served all three");
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("sendBytes() refuses a status line that is not 'HTTP/1.x' and three digits", async () => {
  const request = new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\n\r\n");
  for (
    const line of ["HTTP/1.1 2x0 OK", "http/1.1 200 OK", "HTTP/2.0 200 OK", "HTTP/1.1 099 Low"]
  ) {
    const raw = rawServer(`${line}\r\ncontent-length: 0\r\n\r\n`);
    const client = createH1Client();
    try {
      await assert.rejects(client.sendBytes(raw.url, request, null), /bad status line/, line);
    } finally {
      client.close();
      await raw.close();
    }
  }
  const raw = rawServer("HTTP/1.0 204 No Content\r\n\r\n");
  const client = createH1Client();
  try {
    const answer = await client.sendBytes(raw.url, request, null);
    assert.equal(answer.head.status, 204);
    assert.equal(answer.head.http11, false);
    assert.equal(answer.wholeLength(), 0);
    answer.copyWhole(new Uint8Array(0), 0);
  } finally {
    client.close();
    await raw.close();
  }
});

Deno.test("createH1Client() drops an idle connection the node closes, before any request needs it", async () => {
  // A keep-alive answer, then the node ends the connection while it sits in the pool.
  const { url, close } = rawServer("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
  const client = createH1Client({ idleTimeoutMs: 60_000 });
  try {
    assert.equal(await (await client.fetch(url)).text(), "ok");
    // The idle read hears the end; the sweep (60 s away) has no part in it. Bounded: 2 s.
    const deadline = Date.now() + 2000;
    while (client.open > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.equal(client.open, 0, "the closed connection left the pool");
  } finally {
    client.close();
    await close();
  }
});

Deno.test("createH1Client() starts an idle connection's read when the next request is written", async () => {
  // Two nodes that each answer once and close. With the idle read's own timer a minute away, the
  // first connection's close can only be heard once the second request is written, by either way.
  const request = new TextEncoder().encode(
    "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
  );
  const second = {
    fetch: async (client: H1Client, url: string) =>
      await (await client.fetch(url, { method: "POST", body: "x" })).text(),
    sendBytes: async (client: H1Client, url: string) => {
      const answer = await client.sendBytes(url, request, null);
      const into = new Uint8Array(answer.wholeLength());
      answer.copyWhole(into, 0);
      return new TextDecoder().decode(into);
    },
  };
  for (const [way, send] of Object.entries(second)) {
    const a = rawServer("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na");
    const b = rawServer("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb");
    const client = createH1Client({ idleTimeoutMs: 60_000, idleReadAfterMs: 60_000 });
    try {
      assert.equal(await (await client.fetch(a.url)).text(), "a");
      assert.equal(client.open, 1, "the first connection is pooled, its close not heard yet");
      assert.equal(await send(client, b.url), "b", way);
      const deadline = Date.now() + 2000;
      while (client.open > 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      assert.equal(client.open, 1, `${way}: the first node's close was heard, not the second's`);
    } finally {
      client.close();
      await a.close();
      await b.close();
    }
  }
});

Deno.test("createH1Client() sends a fixed body again once when a pooled connection was closed", async () => {
  // Answers, then closes the connection without saying so: the pooled one is stale.
  let seen = 0;
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const done = (async () => {
    for await (const conn of listener) {
      const buf = new Uint8Array(4096);
      await conn.read(buf);
      seen++;
      await conn.write(new TextEncoder().encode("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"));
      conn.close();
    }
  })().catch(() => {});
  const client = createH1Client();
  try {
    const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
    assert.equal(await (await client.fetch(url, { method: "POST", body: "a" })).text(), "ok");
    assert.equal(await (await client.fetch(url, { method: "POST", body: "b" })).text(), "ok");
    assert.equal(seen, 2);
  } finally {
    client.close();
    listener.close();
    await done;
  }
});

Deno.test("createH1Client() refuses a header value with a line break", async () => {
  const client = createH1Client();
  await assert.rejects(
    client.fetch("http://127.0.0.1:9/", { headers: [["x-a", "1\r\nx-b: 2"]] }),
    /line break/,
  );
  client.close();
});

Deno.test("createH1Client() sends an https request to otherSchemes, and refuses it without", async () => {
  const asked: string[] = [];
  const client = createH1Client({
    otherSchemes: (input) => {
      asked.push(String(input));
      return Promise.resolve(new Response("over tls"));
    },
  });
  const bare = createH1Client();
  try {
    const res = await client.fetch("https://node.test:3676/execCommand", { method: "POST" });
    assert.equal(await res.text(), "over tls");
    assert.deepEqual(asked, ["https://node.test:3676/execCommand"]);
    await assert.rejects(bare.fetch("https://node.test:3676/"), /plain http only/);
  } finally {
    client.close();
    bare.close();
  }
});

Deno.test("createH1Client() with one connection serves the next request after each way a request can fail", async () => {
  const { server, url } = serve(async (r) => {
    const path = new URL(r.url).pathname;
    // Answers before reading the upload, as a node refusing a body does.
    if (path === "/refuse") return new Response("no", { status: 413 });
    if (path === "/long") {
      // Cancelled when the client goes: a pull that was pending then finds the stream closed.
      let gone = false;
      return new Response(
        new ReadableStream({
          pull: (c) =>
            new Promise((res) =>
              setTimeout(() => res(gone ? undefined : c.enqueue(new Uint8Array(1024))), 5)
            ),
          cancel: () => void (gone = true),
        }),
      );
    }
    if (path === "/hold") await new Promise((res) => r.signal.addEventListener("abort", res));
    return new Response(`ok ${await r.text()}`);
  });
  const client = createH1Client({ maxConnections: 1 });
  // A slot that leaked would make the next request wait for ever: each gets a bound.
  const next = async (label: string) => {
    const res = await client.fetch(`${url}/echo`, {
      method: "POST",
      body: label,
      signal: AbortSignal.timeout(2000),
    });
    assert.equal(await res.text(), `ok ${label}`);
  };
  try {
    await next("first");

    // 1. The node answers early, the streamed upload never ends.
    const upload = new ReadableStream<Uint8Array>({
      start: (c) => c.enqueue(new Uint8Array(10)),
    });
    const refused = await client.fetch(`${url}/refuse`, { method: "PUT", body: upload });
    assert.equal(refused.status, 413);
    await refused.body?.cancel();
    await next("after an early answer");

    // 2. The reader cancels a body mid-way (a client hanging up while an answer streams).
    const long = await client.fetch(`${url}/long`);
    const reader = long.body!.getReader();
    await reader.read();
    await reader.cancel();
    await next("after a cancelled body");

    // 3. The caller aborts before the head.
    const ac = new AbortController();
    const held = client.fetch(`${url}/hold`, { method: "POST", body: "x", signal: ac.signal });
    setTimeout(() => ac.abort(new Error("gone")), 20);
    await assert.rejects(held, /gone/);
    await next("after an abort");

    // 4. Nothing listens: a refused connect frees its slot too.
    await assert.rejects(client.fetch("http://127.0.0.1:9/"), TypeError);
    await next("after a refused connect");

    assert.ok(client.open <= 1, `open ${client.open}`);
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() reuses a connection's read buffer without overwriting an answer still held", async () => {
  let n = 0;
  const { server, url } = serve(() => new Response(`answer ${++n}`));
  const client = createH1Client();
  try {
    // Small sized answers read whole: the first is read only after the second has come in over
    // the same connection, into the same read buffer.
    const first = await client.fetch(url);
    const second = await client.fetch(url);
    const third = await client.fetch(url);
    assert.equal(client.open, 1);
    assert.equal(await first.text(), "answer 1");
    assert.equal(await second.text(), "answer 2");
    assert.equal(await third.text(), "answer 3");
  } finally {
    client.close();
    await server.shutdown();
  }
});

Deno.test("sendBytes(): a request the socket takes 1000 bytes at a time reaches the node whole", async () => {
  const request = new TextEncoder().encode(
    `POST /x HTTP/1.1\r\nhost: n\r\ncontent-length: 6000\r\n\r\n${"q".repeat(6000)}`,
  );
  const got: number[] = [];
  let wake: ((n: number | null) => void) | undefined, into: Uint8Array | undefined;
  const answer = new TextEncoder().encode("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
  // A node's connection whose writes take at most 1000 bytes; it answers once all has come.
  const fake = {
    setNoDelay() {},
    close() {
      wake?.(null);
    },
    write(p: Uint8Array): Promise<number> {
      const n = Math.min(1000, p.length);
      got.push(...p.subarray(0, n));
      if (got.length === request.length && wake !== undefined) {
        into!.set(answer);
        wake(answer.length);
      }
      return Promise.resolve(n);
    },
    read(p: Uint8Array): Promise<number | null> {
      if (got.length === request.length) {
        p.set(answer);
        return Promise.resolve(answer.length);
      }
      into = p;
      return new Promise((resolve) => wake = resolve);
    },
  };
  const connect = Deno.connect;
  (Deno as { connect: unknown }).connect = () => Promise.resolve(fake);
  const client = createH1Client();
  try {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("no answer within 2 s")), 2000);
    });
    const exchange = (async () => {
      const a = await client.sendBytes("http://127.0.0.1:9", request, null);
      const body = new Uint8Array(a.wholeLength());
      a.copyWhole(body, 0);
      return new TextDecoder().decode(body);
    })();
    try {
      assert.equal(await Promise.race([exchange, late]), "ok");
    } finally {
      clearTimeout(timer);
    }
    assert.equal(got.length, request.length);
    assert.deepEqual(new Uint8Array(got), request);
  } finally {
    (Deno as { connect: unknown }).connect = connect;
    client.close();
  }
});

Deno.test("createH1Client() fails a chunked answer that breaks the coding, never passing on what follows", async () => {
  // Each would let a node (or whatever answers on its port) slip bytes past the framing: data
  // longer than its size, a size line with junk after the digits, a line ended by a bare LF.
  const broken = [
    "3\r\nabcEXTRA\r\n0\r\n\r\n",
    "3 junk\r\nabc\r\n0\r\n\r\n",
    "3\nabc\r\n0\r\n\r\n",
  ];
  for (const body of broken) {
    const raw = rawServer(`HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n${body}`);
    const client = createH1Client();
    try {
      const res = await client.fetch(raw.url);
      await assert.rejects(res.text(), /error reading response/, JSON.stringify(body));
      const request = new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\n\r\n");
      const answer = await client.sendBytes(raw.url, request, null);
      await assert.rejects(
        (async () => {
          while ((await answer.next()) !== null) { /* read on */ }
        })(),
        /error reading response/,
        JSON.stringify(body),
      );
      assert.equal(client.open, 0, "a connection whose answer broke its framing was kept");
    } finally {
      client.close();
      await raw.close();
    }
  }
});

Deno.test("createH1Client() refuses an answer head whose framing two readers could read two ways", async () => {
  // Two different lengths (the bytes path took the last), a length whose name has a space before
  // its colon (read as no length at all, so the body ran to the close), a folded line.
  const heads = [
    "content-length: 3\r\ncontent-length: 5",
    "content-length : 3",
    "x-a: 1\r\n folded: 2\r\ncontent-length: 3",
  ];
  for (const head of heads) {
    const raw = rawServer(`HTTP/1.1 200 OK\r\n${head}\r\n\r\nabcde`);
    const client = createH1Client();
    try {
      await assert.rejects(client.fetch(raw.url), /error reading response/, JSON.stringify(head));
      const request = new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\n\r\n");
      await assert.rejects(
        client.sendBytes(raw.url, request, null),
        /error reading response/,
        JSON.stringify(head),
      );
      assert.equal(client.open, 0);
    } finally {
      client.close();
      await raw.close();
    }
  }
});

Deno.test("createH1Client() sends a caller's Host only with hostFromHeaders", async () => {
  const { server, url } = serve((r) => new Response(r.headers.get("host")));
  const plain = createH1Client();
  const masking = createH1Client({ hostFromHeaders: true });
  try {
    const port = new URL(url).port;
    const dropped = await plain.fetch(`${url}/`, { headers: { host: "localhost:8000" } });
    assert.equal(await dropped.text(), `127.0.0.1:${port}`);
    const kept = await masking.fetch(`${url}/`, { headers: { host: "localhost:8000" } });
    assert.equal(await kept.text(), "localhost:8000");
    const none = await masking.fetch(`${url}/`);
    assert.equal(await none.text(), `127.0.0.1:${port}`);
    await assert.rejects(
      masking.fetch(`${url}/`, { headers: [["host", "a\r\nx-evil: 1"]] }),
      /line break/,
    );
  } finally {
    plain.close();
    masking.close();
    await server.shutdown();
  }
});

Deno.test("createH1Client() names the Host header as Go and browsers write it", async () => {
  // A server in a sandbox that reads its headers as they came (Python's http.server does) sees
  // `Host:`, as behind E2B's proxy; the e2b SDK's maskRequestHost test looks for exactly that.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const seen = (async () => {
    const conn = await listener.accept();
    const buf = new Uint8Array(4096);
    const n = await conn.read(buf);
    await conn.write(new TextEncoder().encode("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
    conn.close();
    return new TextDecoder().decode(buf.subarray(0, n ?? 0));
  })();
  const masking = createH1Client({ hostFromHeaders: true });
  try {
    const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}/`;
    const res = await masking.fetch(url, { headers: { host: "custom-host.example.com:8080" } });
    await res.body?.cancel();
    const head = await seen;
    assert.match(head, /^GET \/ HTTP\/1\.1\r\nHost: custom-host\.example\.com:8080\r\n/);
  } finally {
    masking.close();
    listener.close();
  }
});

Deno.test("createH1Client({ connect }) sends https: URLs on the connections it opens, port 443 by default", async () => {
  const { server } = serve((r) =>
    new Response(`host ${r.headers.get("host")} ${new URL(r.url).pathname}`)
  );
  const asked: { hostname: string; port: number }[] = [];
  const client = createH1Client({
    // Plain TCP to the test server stands for the TLS a caller would start on it.
    connect: (to) => {
      asked.push(to);
      return Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    },
  });
  try {
    const res = await client.fetch("https://api.example.test/a?b=1");
    assert.equal(await res.text(), "host api.example.test /a");
    const again = await client.fetch("https://api.example.test:8443/c");
    assert.equal(await again.text(), "host api.example.test:8443 /c");
    assert.deepEqual(asked, [
      { hostname: "api.example.test", port: 443 },
      { hostname: "api.example.test", port: 8443 },
    ]);
    // Without `connect`, an https: URL is still not this client's to send.
    const plain = createH1Client();
    await assert.rejects(plain.fetch("https://api.example.test/"), TypeError);
    plain.close();
  } finally {
    client.close();
    await server.shutdown();
  }
});
