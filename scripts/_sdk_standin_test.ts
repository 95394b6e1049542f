import assert from "node:assert/strict";
import { dnsAnswer } from "./_sdk_standin.ts";

/** A DNS query for `name` and `type` (1 = A, 28 = AAAA), id 0xbeef, recursion desired. */
function query(name: string, type: number): Uint8Array {
  const labels = name.split(".").flatMap((l) => [l.length, ...new TextEncoder().encode(l)]);
  return new Uint8Array([0xbe, 0xef, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, ...labels, 0, 0, type, 0, 1]);
}

const NAME = "connectivitycheck.gstatic.com";

Deno.test("dnsAnswer() answers A for the stand-in's name with its address, the question kept", () => {
  const q = query("ConnectivityCheck.gstatic.com", 1);
  const a = dnsAnswer(q, NAME, "198.18.0.3")!;
  assert.deepEqual([...a.subarray(0, 12)], [0xbe, 0xef, 0x85, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
  assert.deepEqual(a.subarray(12, q.length), q.subarray(12));
  assert.deepEqual([...a.subarray(q.length)], [
    0xc0,
    12,
    0,
    1,
    0,
    1,
    0,
    0,
    0,
    60,
    0,
    4,
    198,
    18,
    0,
    3,
  ]);
});

Deno.test("dnsAnswer() gives no record for another type of the name and REFUSED for any other name", () => {
  const aaaa = dnsAnswer(query(NAME, 28), NAME, "198.18.0.3")!;
  assert.equal(aaaa[3] & 0x0f, 0, "NOERROR");
  assert.equal(aaaa[7], 0, "no answer record");
  const other = dnsAnswer(query("example.com", 1), NAME, "198.18.0.3")!;
  assert.equal(other[3] & 0x0f, 5, "REFUSED");
  assert.equal(other[7], 0, "no answer record");
  // A name that merely ends with the stand-in's is another name.
  assert.equal(dnsAnswer(query(`x.${NAME}`, 1), NAME, "198.18.0.3")![3] & 0x0f, 5);
});

Deno.test("dnsAnswer() does not answer a truncated query, a label running past the end or a response", () => {
  const q = query(NAME, 1);
  assert.equal(dnsAnswer(q.subarray(0, 16), NAME, "198.18.0.3"), null);
  assert.equal(dnsAnswer(q.subarray(0, q.length - 3), NAME, "198.18.0.3"), null);
  const cut = q.slice(0, 20);
  assert.equal(dnsAnswer(cut, NAME, "198.18.0.3"), null);
  const response = q.slice();
  response[2] |= 0x80;
  assert.equal(dnsAnswer(response, NAME, "198.18.0.3"), null);
});
