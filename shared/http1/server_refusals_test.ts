/**
 * The bytes engine's refusals, black-box: each head shape RFC 9112 refuses (or a proxy must, to
 * keep requests from being smuggled past it) is answered with its status, then the connection is
 * closed, and the handler never sees it.
 */
import assert from "node:assert/strict";
import { seeded } from "../_seeded_fixtures_test.ts";
import { type Client, firstHead, hasHeader, ok, withServer } from "./_server_fixtures_test.ts";

// --- Refused heads: the status as an answer, then the connection closed. ---

/** [what, bytes sent, status, the body's message]. */
const refusedHeads: [string, string, number, RegExp][] = [
  ["bare LF line endings", "GET / HTTP/1.1\nHost: x\n\n", 400, /bare LF/],
  ["a bare LF ending a header line", "GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n", 400, /bare LF/],
  ["a bare LF as the blank line", "GET / HTTP/1.1\r\nHost: x\r\n\n", 400, /bare LF/],
  ["a bare LF before the blank line", "GET / HTTP/1.1\r\nHost: x\n\r\n", 400, /bare LF/],
  ["obs-fold (space)", "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", 400, /obs-fold/],
  ["obs-fold (tab)", "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\t2\r\n\r\n", 400, /obs-fold/],
  [
    "whitespace before a colon",
    "GET / HTTP/1.1\r\nHost : x\r\n\r\n",
    400,
    /whitespace before its colon/,
  ],
  [
    "a control character in a value",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
    400,
    /control character/,
  ],
  ["DEL in a value", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", 400, /control character/],
  [
    "Content-Length and Transfer-Encoding",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    400,
    /both Content-Length and Transfer-Encoding/,
  ],
  [
    "two differing Content-Lengths",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    400,
    /differ/,
  ],
  [
    "a non-numeric Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: five\r\n\r\n",
    400,
    /not a length/,
  ],
  [
    "a negative Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    400,
    /not a length/,
  ],
  [
    "Transfer-Encoding: gzip, chunked",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    501,
    /not served/,
  ],
  [
    "Transfer-Encoding: chunked, identity",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    501,
    /not served/,
  ],
  [
    "Transfer-Encoding in HTTP/1.0",
    "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    400,
    /HTTP\/1\.0/,
  ],
  ["HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, /HTTP\/2\.0/],
  ["HTTP/1.2", "GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, /HTTP\/1\.2/],
  ["a garbage version", "GET / HTTQ/1.1\r\nHost: x\r\n\r\n", 400, /not a version/],
  ["a missing Host in HTTP/1.1", "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", 400, /Host/],
  ["two Host headers", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, /two Host/],
  [
    "a target that is no path or absolute URL",
    "GET example.test/x HTTP/1.1\r\nHost: x\r\n\r\n",
    400,
    /not a path or an absolute URL/,
  ],
  [
    "Expect other than 100-continue",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 200-ok\r\n\r\n",
    417,
    /Expect '200-ok'/,
  ],
];

/** Sends `bytes` and asserts the answer `status` (its body matching `message`), then EOF. */
async function assertRefused(c: Client, bytes: string, status: number, message?: RegExp) {
  await c.write(bytes);
  await c.until((t) => t.includes("\r\n\r\n") || t.length > 0 && c.closed());
  assert.match(
    c.received(),
    new RegExp(`^HTTP/1\\.1 ${status} `),
    `the status line: got ${JSON.stringify(c.received())}`,
  );
  await c.closedWithin(2000);
  const text = c.received();
  const head = firstHead(text);
  assert.ok(hasHeader(head, "connection: close"), head);
  if (message !== undefined) assert.match(text.slice(head.length), message);
}

for (const [what, bytes, status, message] of refusedHeads) {
  Deno.test(`bytes engine: ${what} is answered ${status}, then the connection closed`, async () => {
    let served = 0;
    await withServer(() => {
      served++;
      return ok();
    }, async ({ connect }) => {
      await assertRefused(await connect(), bytes, status, message);
    });
    assert.equal(served, 0, "the handler saw a refused request");
  });
}

Deno.test("bytes engine: 300 mutated requests never crash it: a 4xx, a served answer or a close", async () => {
  const valid = [
    "GET /a?b=1 HTTP/1.1\r\nHost: x:80\r\nAccept: */*\r\nX-Trace: abc\r\n\r\n",
    "POST /execCommand HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
    'Content-Length: 13\r\n\r\n{"name":"a1"}',
    "POST /u HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
    "5;e=1\r\nhello\r\n0\r\nT: v\r\n\r\n",
  ];
  const interesting = "\r\n\0\t :;,-0123456789aZ\x7f\xff";
  const random = seeded(16);
  const pick = (n: number) => Math.floor(random() * n);
  const mutate = (text: string): string => {
    let out = text;
    for (let k = 1 + pick(3); k > 0; k--) {
      const at = pick(out.length);
      const c = interesting[pick(interesting.length)];
      const how = pick(4);
      if (how === 0) out = out.slice(0, at) + c + out.slice(at + 1);
      else if (how === 1) out = out.slice(0, at) + c + out.slice(at);
      else if (how === 2) out = out.slice(0, at) + out.slice(at + 1);
      else {
        const lines = out.split("\r\n");
        const i = pick(lines.length);
        lines.splice(i, 0, lines[i]);
        out = lines.join("\r\n");
      }
    }
    return out;
  };
  const allowed = new Set([200, 400, 413, 417, 431, 501, 505]);
  const statuses = new Map<number, number>();
  let closedOnly = 0;
  await withServer(async (request) => {
    await request.arrayBuffer().catch(() => {});
    return ok();
  }, async ({ connect }) => {
    for (let i = 0; i < 300; i++) {
      const sent = mutate(valid[i % valid.length]);
      const c = await connect();
      await c.write(sent).catch(() => {});
      // The end of the stream: a request the mutation left incomplete is not waited for.
      await c.endWrite().catch(() => {});
      await c.closedWithin(2000);
      for (const m of c.received().matchAll(/HTTP\/1\.1 (\d{3}) /g)) {
        const status = Number(m[1]);
        assert.ok(allowed.has(status), `${status} for ${JSON.stringify(sent)}`);
        statuses.set(status, (statuses.get(status) ?? 0) + 1);
      }
      if (c.received() === "") closedOnly++;
      await c.close();
    }
    // Still serving, and the mutations reached both the refusals and the handler.
    const after = await connect();
    await after.write(valid[0]);
    await after.until("ok");
    assert.ok((statuses.get(400) ?? 0) > 0, JSON.stringify([...statuses]));
    assert.ok((statuses.get(200) ?? 0) > 0, JSON.stringify([...statuses]));
    assert.ok(closedOnly < 300, "some mutation got an answer");
  });
});

Deno.test("bytes engine: a head longer than 64 KiB is answered 431, then closed", async () => {
  await withServer(ok, async ({ connect }) => {
    // A whole head past the bound.
    const whole = `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(70_000)}\r\n\r\n`;
    await assertRefused(await connect(), whole, 431, /longer than 65536 bytes/);
    // One that never ends.
    const endless = `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(66_000)}`;
    await assertRefused(await connect(), endless, 431, /longer than 65536 bytes/);
    // A head just under the bound is served.
    const c = await connect();
    await c.write(`GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(60_000)}\r\n\r\n`);
    await c.until("ok");
    assert.match(c.received(), /^HTTP\/1\.1 200 /);
  });
});

Deno.test("bytes engine: a Host that is no host[:port] is answered 400, not routed", async () => {
  // RFC 9112 §3.2: a Host with an invalid value MUST be answered 400. Taken into the URL as is,
  // `Host: x/admin#` turns the request for /public into one for /admin.
  const paths: string[] = [];
  await withServer((request) => {
    paths.push(new URL(request.url).pathname);
    return ok();
  }, async ({ connect }) => {
    const got: string[] = [];
    for (const host of ["evil.test/admin#", "evil.test/admin?", "user@evil.test"]) {
      const c = await connect();
      await c.write(`GET /public HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
      await c.closedWithin(2000);
      got.push(`Host: ${host} -> ${c.received().split("\r\n")[0]}`);
    }
    assert.deepEqual(
      got.map((line) => line.replace(/ -> HTTP\/1\.1 400 .*/, " -> 400")),
      ["evil.test/admin#", "evil.test/admin?", "user@evil.test"].map((h) => `Host: ${h} -> 400`),
      `the handler saw the paths ${JSON.stringify(paths)}`,
    );
  });
});

// --- Bodies. ---

Deno.test("bytes engine: a chunked body that breaks its framing is the client's 400, whatever the handler answered", async () => {
  // A forwarding handler sees its upload fail and answers 502, naming the node; the bytes that
  // failed were the client's, so the client is told that, and the connection ends.
  let failed = false;
  await withServer(async (request) => {
    try {
      await request.arrayBuffer();
      return ok();
    } catch {
      failed = true;
      return Response.json({ message: "Node 'a' did not answer" }, { status: 502 });
    }
  }, async ({ connect }) => {
    await assertRefused(
      await connect(),
      "POST /u HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
      400,
      /chunk size '5 '/,
    );
  });
  assert.ok(failed, "the handler's read of the body failed");
});
