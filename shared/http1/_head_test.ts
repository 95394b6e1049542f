import assert from "node:assert/strict";
import {
  byteIndex,
  headEnd,
  HeadError,
  parseHead,
  recentOctets,
  type RequestHead,
} from "./_head.ts";

/** The bytes of `text`, one byte per char (header bytes are octets). */
function octets(text: string): Uint8Array {
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

/** Finds the head in `text` with `headEnd` (it must be found) and parses it. */
function parse(text: string): RequestHead {
  const b = octets(text);
  const end = headEnd(b, 0, b.length);
  assert.notEqual(end, -1, `headEnd found no end in ${JSON.stringify(text)}: it would wait`);
  return parseHead(b, 0, end);
}

/** Asserts that `text` is refused with `status` and a message matching `message`. */
function refused(text: string, status: number, message: RegExp) {
  const b = octets(text);
  const end = headEnd(b, 0, b.length);
  assert.notEqual(end, -1, `headEnd found no end in ${JSON.stringify(text)}: it would wait`);
  assert.throws(
    () => parseHead(b, 0, end),
    (error: unknown) => {
      assert.ok(error instanceof HeadError, `not a HeadError: ${error}`);
      assert.equal(error.status, status, `status for ${JSON.stringify(text)}: ${error.message}`);
      assert.match(error.message, message);
      return true;
    },
  );
}

const H = "Host: example.test\r\n";

Deno.test("byteIndex finds a byte within its bounds only, as indexOf does within them", () => {
  const b = octets("ab\ncd\nef:");
  assert.equal(byteIndex(b, 10, 0), 2);
  assert.equal(byteIndex(b, 10, 3), 5);
  assert.equal(byteIndex(b, 10, 6), -1);
  // A byte at or past `to` is not found, nor one before `from`.
  assert.equal(byteIndex(b, 10, 3, 5), -1);
  assert.equal(byteIndex(b, 10, 3, 6), 5);
  assert.equal(byteIndex(b, 97, 1), -1);
  assert.equal(byteIndex(b, 58, 0), 8);
  assert.equal(byteIndex(b, 58, 0, 8), -1);
  for (let from = 0; from <= b.length; from++) {
    assert.equal(byteIndex(b, 10, from), b.indexOf(10, from), `from ${from}`);
  }
});

Deno.test("parseHead reads no line past the head's end: the next request's bytes are not its own", () => {
  // A head whose last header line has no LF before `end` is refused, though a pipelined request
  // after it holds one.
  const b = octets(`GET / HTTP/1.1\r\n${H}X: 1\r\n\r\nGET /next HTTP/1.1\r\n${H}\r\n`);
  const end = headEnd(b, 0, b.length);
  assert.equal(parseHead(b, 0, end).target, "/");
  assert.equal(parseHead(b, end, headEnd(b, end, b.length)).target, "/next");
});

Deno.test("headEnd finds the index after the blank line, or -1 while the head is not all there", () => {
  const head = `GET / HTTP/1.1\r\n${H}\r\n`;
  const b = octets(head + "body bytes");
  assert.equal(headEnd(b, 0, b.length), head.length, "the body after the head is not the head");
  assert.equal(headEnd(b, 0, head.length), head.length);
  for (let cut = 0; cut < head.length; cut++) {
    assert.equal(headEnd(b, 0, cut), -1, `found an end in the first ${cut} bytes`);
  }
  // A head that starts further into the buffer (a pipelined one).
  const two = octets(`${head}GET /2 HTTP/1.1\r\n${H}\r\n`);
  assert.equal(headEnd(two, head.length, two.length), two.length);
  assert.equal(headEnd(two, head.length, two.length - 1), -1);
});

Deno.test("headEnd finds a head ended by bare LFs, so that parseHead refuses it", () => {
  const lf = octets(`GET / HTTP/1.1\nHost: x\n\n`);
  assert.equal(headEnd(lf, 0, lf.length), lf.length);
});

Deno.test("parseHead reads a good head", () => {
  const text = "POST /p/a%20th?q=1&r=%2F HTTP/1.1\r\n" +
    "Host: Example.Test:8080\r\n" +
    "X-Mixed-Case:   padded  inner\t \r\n" +
    "content-LENGTH: 5\r\n" +
    "Accept: */*\r\n" +
    "X-Empty:\r\n" +
    "\r\n";
  const b = octets(text + "hello");
  const end = headEnd(b, 0, b.length);
  assert.equal(end, text.length);
  const head = parseHead(b, 0, end);
  assert.equal(head.method, "POST");
  assert.equal(head.target, "/p/a%20th?q=1&r=%2F");
  assert.equal(head.http11, true);
  assert.deepEqual(head.names, ["host", "x-mixed-case", "content-length", "accept", "x-empty"]);
  assert.deepEqual(head.values, ["Example.Test:8080", "padded  inner", "5", "*/*", ""]);
  assert.equal(head.contentLength, 5);
  assert.equal(head.keepAlive, true);
  assert.equal(head.expectContinue, false);
  assert.equal(head.host, "Example.Test:8080");
  assert.equal(new TextDecoder().decode(head.raw), text);
});

Deno.test("parseHead: a head at an offset, methods case-sensitive, a head without headers", () => {
  const first = `GET /1 HTTP/1.1\r\n${H}\r\n`;
  const b = octets(`${first}get /2 HTTP/1.0\r\n\r\n`);
  const end = headEnd(b, first.length, b.length);
  const head = parseHead(b, first.length, end);
  assert.equal(head.method, "get");
  assert.equal(head.target, "/2");
  assert.equal(head.http11, false);
  assert.deepEqual(head.names, []);
  assert.equal(head.host, "");
  assert.equal(head.contentLength, 0);
});

Deno.test("parseHead: contentLength is 0 without a body, -1 when chunked", () => {
  assert.equal(parse(`GET / HTTP/1.1\r\n${H}\r\n`).contentLength, 0);
  assert.equal(parse(`POST / HTTP/1.1\r\n${H}Content-Length: 0\r\n\r\n`).contentLength, 0);
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n`).contentLength,
    -1,
  );
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}Transfer-Encoding:  Chunked \r\n\r\n`).contentLength,
    -1,
    "the coding name is case-insensitive",
  );
  assert.equal(parse(`POST / HTTP/1.1\r\n${H}Content-Length: 007\r\n\r\n`).contentLength, 7);
});

Deno.test("parseHead: keepAlive by version and Connection", () => {
  const cases: [string, string, boolean][] = [
    ["HTTP/1.1", "", true],
    ["HTTP/1.1", "Connection: keep-alive\r\n", true],
    ["HTTP/1.1", "Connection: close\r\n", false],
    ["HTTP/1.1", "Connection: Close\r\n", false],
    ["HTTP/1.1", "Connection: keep-alive, close\r\n", false],
    ["HTTP/1.1", "Connection: upgrade\r\nConnection: close\r\n", false],
    ["HTTP/1.1", "Connection: closed\r\n", true],
    ["HTTP/1.0", "", false],
    ["HTTP/1.0", "Connection: keep-alive\r\n", true],
    ["HTTP/1.0", "Connection: Keep-Alive\r\n", true],
    ["HTTP/1.0", "Connection: keep-alive, close\r\n", false],
    ["HTTP/1.0", "Connection: close\r\n", false],
  ];
  for (const [version, connection, keepAlive] of cases) {
    const head = parse(`GET / ${version}\r\n${H}${connection}\r\n`);
    assert.equal(head.keepAlive, keepAlive, `${version} ${JSON.stringify(connection)}`);
  }
});

Deno.test("parseHead: expectContinue for 100-continue in HTTP/1.1 only", () => {
  const body = "Content-Length: 5\r\n";
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}${body}Expect: 100-continue\r\n\r\n`).expectContinue,
    true,
  );
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}${body}Expect: 100-Continue\r\n\r\n`).expectContinue,
    true,
  );
  assert.equal(
    parse(`POST / HTTP/1.0\r\n${body}Expect: 100-continue\r\n\r\n`).expectContinue,
    false,
    "an HTTP/1.0 client is sent no 100 (RFC 9110 §10.1.1)",
  );
  assert.equal(parse(`POST / HTTP/1.1\r\n${H}${body}\r\n`).expectContinue, false);
});

Deno.test("parseHead: the targets it takes", () => {
  assert.equal(parse(`OPTIONS * HTTP/1.1\r\n${H}\r\n`).target, "*");
  assert.equal(parse(`GET http://a.test/x?y HTTP/1.1\r\n${H}\r\n`).target, "http://a.test/x?y");
  assert.equal(parse(`GET HTTPS://a.test/ HTTP/1.1\r\n${H}\r\n`).target, "HTTPS://a.test/");
  assert.equal(parse(`GET /a/../b HTTP/1.1\r\n${H}\r\n`).target, "/a/../b", "as sent");
});

Deno.test("parseHead: equal Content-Lengths are one", () => {
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nContent-Length: 5\r\n\r\n`).contentLength,
    5,
  );
  assert.equal(parse(`POST / HTTP/1.1\r\n${H}Content-Length: 5, 5\r\n\r\n`).contentLength, 5);
  assert.equal(parse(`POST / HTTP/1.1\r\n${H}Content-Length: 5,5 , 5\r\n\r\n`).contentLength, 5);
});

Deno.test("parseHead: HTTP/1.0 needs no Host", () => {
  const head = parse("GET / HTTP/1.0\r\nAccept: */*\r\n\r\n");
  assert.equal(head.host, "");
  assert.equal(head.http11, false);
  assert.equal(parse(`GET / HTTP/1.1\r\nHost:\r\n\r\n`).host, "", "an empty Host is a Host");
});

/** [what, head, status, message]: each refused. */
const refusedHeads: [string, string, number, RegExp][] = [
  ["bare LF line endings", "GET / HTTP/1.1\nHost: x\n\n", 400, /bare LF/],
  ["a bare LF ending the request line", "GET / HTTP/1.1\nHost: x\r\n\r\n", 400, /bare LF/],
  ["a bare LF ending a header line", "GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n", 400, /bare LF/],
  ["a bare LF as the blank line", "GET / HTTP/1.1\r\nHost: x\r\n\n", 400, /bare LF/],
  ["a bare LF before the blank line", "GET / HTTP/1.1\r\nHost: x\n\r\n", 400, /bare LF/],
  [
    "obs-fold with a space",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n",
    400,
    /folded \(obs-fold\)/,
  ],
  [
    "obs-fold with a tab",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\t2\r\n\r\n",
    400,
    /folded \(obs-fold\)/,
  ],
  ["a folded first header", "GET / HTTP/1.1\r\n Host: x\r\n\r\n", 400, /obs-fold/],
  [
    "a space between a name and its colon",
    "GET / HTTP/1.1\r\nHost : x\r\n\r\n",
    400,
    /whitespace before its colon/,
  ],
  [
    "a tab between a name and its colon",
    "GET / HTTP/1.1\r\nHost: x\r\nContent-Length\t: 5\r\n\r\n",
    400,
    /whitespace before its colon/,
  ],
  ["a header line without a colon", "GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, /colon/],
  [
    "\\x01 in a value",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
    400,
    /'x-a' holds a control character/,
  ],
  [
    "DEL in a value",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n",
    400,
    /'x-a' holds a control character/,
  ],
  [
    "NUL in a value",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    400,
    /control character/,
  ],
  [
    "a lone CR in a value",
    "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
    400,
    /control character/,
  ],
  [
    "both Content-Length and Transfer-Encoding",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    400,
    /both Content-Length and Transfer-Encoding/,
  ],
  [
    "Transfer-Encoding before Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n",
    400,
    /both Content-Length and Transfer-Encoding/,
  ],
  [
    "two Content-Lengths that differ",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    400,
    /two Content-Length values differ/,
  ],
  [
    "a Content-Length list that differs",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\n",
    400,
    /two Content-Length values differ/,
  ],
  [
    "a non-numeric Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    400,
    /Content-Length 'abc' is not a length/,
  ],
  [
    "a negative Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    400,
    /Content-Length '-5' is not a length/,
  ],
  [
    "a signed Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
    400,
    /is not a length/,
  ],
  [
    "a hex Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x10\r\n\r\n",
    400,
    /is not a length/,
  ],
  [
    "an empty Content-Length",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n",
    400,
    /is not a length/,
  ],
  [
    "a Content-Length past 2^53",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999999999999\r\n\r\n",
    400,
    /is not a length/,
  ],
  [
    "Transfer-Encoding: gzip, chunked",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    501,
    /Transfer-Encoding 'gzip, chunked' is not served/,
  ],
  [
    "Transfer-Encoding: chunked, identity",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    501,
    /Transfer-Encoding 'chunked, identity' is not served/,
  ],
  [
    "Transfer-Encoding: gzip",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    501,
    /Transfer-Encoding 'gzip' is not served/,
  ],
  [
    "two Transfer-Encoding: chunked lines",
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    501,
    /Transfer-Encoding 'chunked,chunked' is not served/,
  ],
  [
    "Transfer-Encoding in HTTP/1.0",
    "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    400,
    /Transfer-Encoding is not allowed in HTTP\/1\.0/,
  ],
  ["version HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, /HTTP version 'HTTP\/2\.0'/],
  ["version HTTP/1.2", "GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, /HTTP version 'HTTP\/1\.2'/],
  ["version HTTP/3", "GET / HTTP/3\r\nHost: x\r\n\r\n", 505, /HTTP version 'HTTP\/3'/],
  ["a garbage version", "GET / FOO/1.1\r\nHost: x\r\n\r\n", 400, /'FOO\/1\.1', not a version/],
  ["a lowercase version", "GET / http/1.1\r\nHost: x\r\n\r\n", 400, /not a version/],
  ["a version with a suffix", "GET / HTTP/1.1 x\r\nHost: x\r\n\r\n", 400, /not a version/],
  ["no version (HTTP/0.9)", "GET /\r\n\r\n", 400, /no target/],
  ["no method", " / HTTP/1.1\r\nHost: x\r\n\r\n", 400, /no method/],
  ["two spaces before the target", "GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, /no target/],
  [
    "a missing Host in HTTP/1.1",
    "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
    400,
    /must carry a Host header/,
  ],
  [
    "two Host headers",
    "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    400,
    /two Host headers/,
  ],
  [
    "two equal Host headers",
    "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
    400,
    /two Host headers/,
  ],
  [
    "a target with no leading slash",
    "GET example.test/x HTTP/1.1\r\nHost: x\r\n\r\n",
    400,
    /the target 'example\.test\/x' is not a path or an absolute URL/,
  ],
  [
    "an authority-form target",
    "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
    400,
    /is not a path or an absolute URL/,
  ],
  [
    "an ftp target",
    "GET ftp://example.test/ HTTP/1.1\r\nHost: x\r\n\r\n",
    400,
    /is not a path or an absolute URL/,
  ],
  [
    "Expect other than 100-continue",
    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: something\r\n\r\n",
    417,
    /Expect 'something' is not served/,
  ],
];

for (const [what, text, status, message] of refusedHeads) {
  Deno.test(`parseHead refuses ${what} with ${status}`, () => refused(text, status, message));
}

Deno.test("parseHead: fields decoded from recent bytes are the bytes' own text", () => {
  // Same lengths and ends, so they may share a slot of the recent-fields table.
  const a = parse(`GET /aXa HTTP/1.1\r\nHost: h1.test\r\n\r\n`);
  const b = parse(`GET /aYa HTTP/1.1\r\nHost: h2.test\r\n\r\n`);
  const a2 = parse(`GET /aXa HTTP/1.1\r\nHost: h1.test\r\n\r\n`);
  assert.deepEqual([a.target, b.target, a2.target], ["/aXa", "/aYa", "/aXa"]);
  assert.deepEqual([a.host, b.host, a2.host], ["h1.test", "h2.test", "h1.test"]);
  assert.equal(recentOctets(octets("PUT"), 0, 3), "PUT");
  assert.equal(recentOctets(octets("PAT"), 0, 3), "PAT");
  assert.equal(recentOctets(octets("PUT"), 0, 3), "PUT");
  assert.equal(recentOctets(octets(""), 0, 0), "");
  // A Host that passed is no pass for a different one.
  parse(`GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n`);
  refused(`GET / HTTP/1.1\r\nHost: ok.test/x\r\n\r\n`, 400, /is not a host\[:port\]/);
});

Deno.test("parseHead: a plain Content-Length read from its bytes keeps the list rules", () => {
  assert.equal(
    parse(`POST / HTTP/1.1\r\n${H}Content-Length: 123456789012345\r\n\r\n`)
      .contentLength,
    123456789012345,
  );
  refused(
    `POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nContent-Length: 6\r\n\r\n`,
    400,
    /differ/,
  );
  refused(
    `POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nContent-Length: 5, 6\r\n\r\n`,
    400,
    /differ/,
  );
  refused(`POST / HTTP/1.1\r\n${H}Content-Length: 5x\r\n\r\n`, 400, /not a length/);
});
