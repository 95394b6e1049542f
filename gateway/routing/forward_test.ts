import assert from "node:assert/strict";
import { capture, forward, HangUpWatch } from "./forward.ts";
import { HttpError } from "../../shared/http_error.ts";
import { FakeClock } from "../../shared/clock.ts";

const target = { nodeId: "a", endpoint: "http://node-a.test:3676" };

Deno.test("forward() passes method, path, body and end-to-end headers, not hop-by-hop ones", async () => {
  let seen: Request | undefined;
  const fakeFetch = (input: RequestInfo | URL, init?: RequestInit) => {
    seen = new Request(input, init);
    return Promise.resolve(new Response("ok", { status: 201, headers: { "x-node": "a" } }));
  };
  const req = new Request("http://gw.test/execCommand", {
    method: "POST",
    headers: { "content-type": "application/json", connection: "keep-alive", "x-trace": "1" },
    body: '{"name":"x"}',
  });
  const res = await forward(req, target, {
    path: "/execCommand",
    headers: { authorization: "Bearer node-token" },
    fetch: fakeFetch as typeof fetch,
  });
  assert.equal(res.status, 201);
  assert.equal(res.headers.get("x-node"), "a");
  assert.equal(await res.text(), "ok");
  assert.equal(seen!.url, "http://node-a.test:3676/execCommand");
  assert.equal(seen!.method, "POST");
  assert.equal(seen!.headers.get("x-trace"), "1");
  assert.equal(seen!.headers.get("connection"), null);
  assert.equal(seen!.headers.get("authorization"), "Bearer node-token");
  assert.equal(await seen!.text(), '{"name":"x"}');
});

Deno.test("forward() answers with the head before the node's body has finished", async () => {
  let push!: (s: string) => void, end!: () => void;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      push = (s) => c.enqueue(new TextEncoder().encode(s));
      end = () => c.close();
    },
  });
  const fakeFetch = () => Promise.resolve(new Response(body, { status: 200 }));
  const res = await forward(new Request("http://gw.test/x"), target, {
    path: "/x",
    fetch: fakeFetch as typeof fetch,
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  push("first");
  assert.equal(new TextDecoder().decode((await reader.read()).value), "first");
  end();
  assert.equal((await reader.read()).done, true);
});

Deno.test("forward() is a 502 naming the node when it cannot be reached", async () => {
  const fakeFetch = () =>
    Promise.reject(new TypeError("error sending request: Connection refused"));
  await assert.rejects(
    forward(new Request("http://gw.test/x"), target, {
      path: "/x",
      fetch: fakeFetch as typeof fetch,
    }),
    (e: unknown) =>
      e instanceof HttpError && e.status === 502 &&
      /'a'.*node-a\.test.*ECONNREFUSED: nothing listens/.test(e.message),
  );
});

Deno.test("forward() hands the client's abort to the node's request", async () => {
  const client = new AbortController();
  let nodeSignal: AbortSignal | undefined;
  const fakeFetch = (_: unknown, init?: RequestInit) => {
    nodeSignal = init!.signal!;
    return new Promise<Response>((_, reject) =>
      nodeSignal!.addEventListener("abort", () => reject(nodeSignal!.reason))
    );
  };
  const pending = forward(new Request("http://gw.test/x", { signal: client.signal }), target, {
    path: "/x",
    fetch: fakeFetch as typeof fetch,
  });
  client.abort();
  await assert.rejects(pending);
  assert.equal(nodeSignal!.aborted, true);
});

Deno.test("forward() passes the node's response as it is, unless it names a hop-by-hop header", async () => {
  const plain = new Response("ok", { headers: { "x-node": "a", "content-length": "2" } });
  const same = await forward(new Request("http://gw.test/x"), target, {
    path: "/x",
    fetch: (() => Promise.resolve(plain)) as typeof fetch,
  });
  assert.equal(same, plain);
  assert.equal(await same.text(), "ok");
  const hop = new Response("ok", {
    status: 202,
    headers: { "x-node": "a", connection: "close", "keep-alive": "timeout=5" },
  });
  const cleaned = await forward(new Request("http://gw.test/x"), target, {
    path: "/x",
    fetch: (() => Promise.resolve(hop)) as typeof fetch,
  });
  assert.notEqual(cleaned, hop);
  assert.equal(cleaned.status, 202);
  assert.equal(cleaned.headers.get("x-node"), "a");
  assert.equal(cleaned.headers.get("connection"), null);
  assert.equal(cleaned.headers.get("keep-alive"), null);
  assert.equal(await cleaned.text(), "ok");
});

Deno.test("forward() keeps every Set-Cookie of an answer whose hop-by-hop headers it removes", async () => {
  // Each cookie is its own header (Headers never joins them): copying must not keep only one.
  const headers = new Headers({ "x-dormice-ledger-seq": "7" });
  headers.append("set-cookie", "a=1");
  headers.append("set-cookie", "b=2");
  headers.append("x-node", "a");
  const cleaned = await forward(new Request("http://gw.test/x"), target, {
    path: "/x",
    fetch: (() => Promise.resolve(new Response("ok", { headers }))) as typeof fetch,
  });
  assert.deepEqual(cleaned.headers.getSetCookie(), ["a=1", "b=2"]);
  assert.equal(cleaned.headers.get("x-dormice-ledger-seq"), null, "the node's number is the hop's");
  assert.equal(cleaned.headers.get("x-node"), "a");
});

Deno.test("forward() replaces a client header named in 'headers' whatever its case", async () => {
  let seen: Request | undefined;
  const fakeFetch = (input: RequestInfo | URL, init?: RequestInit) => {
    seen = new Request(input, init);
    return Promise.resolve(new Response("ok"));
  };
  const req = new Request("http://gw.test/x", {
    method: "POST",
    headers: { authorization: "Bearer client", "x-trace": "1", te: "trailers" },
    body: "{}",
  });
  const res = await forward(req, target, {
    path: "/x",
    headers: { Authorization: "Bearer node" },
    fetch: fakeFetch as typeof fetch,
  });
  await res.body?.cancel();
  assert.equal(seen!.headers.get("authorization"), "Bearer node");
  assert.equal(seen!.headers.get("x-trace"), "1");
  assert.equal(seen!.headers.get("te"), null);
});

Deno.test("forward() with a HangUpWatch: a client that hangs up before the head aborts the node", async () => {
  const hangUps = new HangUpWatch({ tickMs: 1 });
  const client = new AbortController();
  let nodeSignal: AbortSignal | undefined;
  let arrived!: () => void;
  const sent = new Promise<void>((resolve) => arrived = resolve);
  const fakeFetch = (_: unknown, init?: RequestInit) => {
    nodeSignal = init!.signal!;
    arrived();
    return new Promise<Response>((_, reject) =>
      nodeSignal!.addEventListener("abort", () => reject(nodeSignal!.reason))
    );
  };
  const pending = forward(new Request("http://gw.test/x", { signal: client.signal }), target, {
    path: "/x",
    fetch: fakeFetch as typeof fetch,
    hangUps,
  });
  await sent;
  client.abort();
  // Tied on the watch's next ticks, not at once: the rejection comes from the node's signal.
  await assert.rejects(pending);
  assert.equal(nodeSignal!.aborted, true);
  assert.equal(hangUps.size, 0);
});

Deno.test("forward() with a HangUpWatch ties a streamed answer's hang-up at its head, not a sized one", async () => {
  const hangUps = new HangUpWatch({ tickMs: 60_000 });
  for (const sized of [false, true]) {
    const client = new AbortController();
    let nodeSignal: AbortSignal | undefined;
    const fakeFetch = (_: unknown, init?: RequestInit) => {
      nodeSignal = init!.signal!;
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(new TextEncoder().encode("ab"));
        },
      });
      return Promise.resolve(
        new Response(body, { headers: sized ? { "content-length": "2" } : {} }),
      );
    };
    const res = await forward(new Request("http://gw.test/x", { signal: client.signal }), target, {
      path: "/x",
      fetch: fakeFetch as typeof fetch,
      hangUps,
    });
    assert.equal(hangUps.size, 0);
    client.abort();
    assert.equal(nodeSignal!.aborted, !sized, sized ? "sized" : "streamed");
    await res.body?.cancel();
  }
});

Deno.test("capture() reads the whole answer and names the node when it is unreachable", async () => {
  const ok = await capture(target, "/acquireSandbox", {
    method: "POST",
    fetch: (() => Promise.resolve(new Response('{"a":1}', { status: 200 }))) as typeof fetch,
  });
  assert.equal(ok.status, 200);
  assert.equal(ok.text, '{"a":1}');
  await assert.rejects(
    capture(target, "/x", {
      fetch: (() => Promise.reject(new TypeError("dns error: failed to lookup"))) as typeof fetch,
    }),
    /DNS: the host name does not resolve/,
  );
});

Deno.test("capture() is a 504 naming the node when it does not finish within its bound", async () => {
  const hang = (_: unknown, init?: RequestInit) =>
    new Promise<Response>((_, reject) =>
      init!.signal!.addEventListener("abort", () => reject(init!.signal!.reason))
    );
  await assert.rejects(
    capture(target, "/acquireSandbox", { fetch: hang as typeof fetch, timeoutMs: 10 }),
    (e: unknown) =>
      e instanceof HttpError && e.status === 504 && /'a'.*acquireSandbox.*10 ms/.test(e.message),
  );
});

Deno.test("forward() appends its hop id to the marker the client's request carried", async () => {
  const seen: (string | null)[] = [];
  const fakeFetch = (input: RequestInfo | URL, init?: RequestInit) => {
    seen.push(new Request(input, init).headers.get("x-dormice-hop"));
    return Promise.resolve(new Response("ok"));
  };
  for (const incoming of [undefined, "gw-before"]) {
    const req = new Request("http://gw.test/x", {
      headers: incoming ? { "x-dormice-hop": incoming } : {},
    });
    // `headers: {}` passes the client's own through (envd): the marker is still ours to extend.
    const res = await forward(req, target, {
      path: "/x",
      headers: {},
      fetch: fakeFetch as typeof fetch,
      hop: "gw-me",
    });
    await res.body?.cancel();
  }
  assert.deepEqual(seen, ["gw-me", "gw-before, gw-me"]);
});

/** A fetch whose head never comes: only an abort ends it. */
const noHead = (_: unknown, init?: RequestInit) =>
  new Promise<Response>((_, reject) => {
    const signal = init!.signal!;
    if (signal.aborted) reject(signal.reason);
    signal.addEventListener("abort", () => reject(signal.reason), { once: true });
  });

Deno.test("forward() with headTimeoutMs is a 504 naming the node when no head comes", async () => {
  const watchClock = new FakeClock();
  const ownClock = new FakeClock();
  for (
    const [clock, hangUps] of [
      [ownClock, undefined],
      [watchClock, new HangUpWatch({ tickMs: 1, clock: watchClock })],
    ] as const
  ) {
    let settled = false;
    const pending = forward(new Request("http://gw.test/x"), target, {
      path: "/x",
      fetch: noHead as typeof fetch,
      hangUps,
      headTimeoutMs: 30,
      timers: ownClock,
    }).finally(() => settled = true);
    // Not a moment early: 29 ms in, the request still waits for the head.
    clock.tick(29);
    await flush();
    assert.equal(settled, false, hangUps ? "watched: gave up early" : "own timer: gave up early");
    clock.tick(1);
    await assert.rejects(
      pending,
      (e: unknown) =>
        e instanceof HttpError && e.status === 504 &&
        /'a' at http:\/\/node-a\.test:3676 sent no answer within 30 ms/.test(e.message) &&
        /DORMICE_GATEWAY_HEAD_TIMEOUT_MS/.test(e.message),
    );
    assert.equal(hangUps?.size ?? 0, 0);
  }
});

/** Lets settled promises run their callbacks (promise turns, no timer). */
async function flush() {
  for (let i = 0; i < 20; i++) await Promise.resolve();
}

Deno.test("forward() counts the head's bound from the end of a streamed body, and not after the head", async () => {
  for (const hangUps of [undefined, new HangUpWatch({ tickMs: 1 })]) {
    // The client uploads for 120 ms; the node answers once it has read it all.
    const upload = new ReadableStream<Uint8Array>({
      async start(c) {
        for (let i = 0; i < 4; i++) {
          c.enqueue(new Uint8Array([i]));
          await new Promise((r) => setTimeout(r, 30));
        }
        c.close();
      },
    });
    const readsThenAnswers = async (_: unknown, init?: RequestInit) => {
      const got = await new Response(init!.body).arrayBuffer();
      // A streamed answer that lasts longer than the bound: once the head came, nothing cuts it.
      const body = new ReadableStream<Uint8Array>({
        async start(c) {
          await new Promise((r) => setTimeout(r, 80));
          c.enqueue(new Uint8Array(got));
          c.close();
        },
      });
      return new Response(body);
    };
    const res = await forward(
      new Request("http://gw.test/x", { method: "POST", body: upload }),
      target,
      { path: "/x", fetch: readsThenAnswers as typeof fetch, hangUps, headTimeoutMs: 50 },
    );
    assert.equal(res.status, 200);
    assert.deepEqual([...new Uint8Array(await res.arrayBuffer())], [0, 1, 2, 3]);
  }
});

Deno.test("HangUpWatch ends the wait for a node its gone check gives up on, with that sentence", async () => {
  let silent = false;
  const hangUps = new HangUpWatch({
    tickMs: 1,
    goneEveryTicks: 1,
    gone: (t) => silent && t.nodeId === "a" ? "Node 'a' stopped checking in" : undefined,
  });
  let asked!: () => void;
  const sent = new Promise<void>((resolve) => asked = resolve);
  const pending = forward(new Request("http://gw.test/x"), target, {
    path: "/x",
    fetch: ((input: unknown, init?: RequestInit) => {
      asked();
      return noHead(input, init);
    }) as typeof fetch,
    hangUps,
  });
  await sent;
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(hangUps.size, 1, "still waiting while the node checks in");
  silent = true;
  await assert.rejects(
    pending,
    (e: unknown) =>
      e instanceof HttpError && e.status === 504 && /stopped checking in/.test(e.message),
  );
  assert.equal(hangUps.size, 0);
});
