import assert from "node:assert/strict";
import { seeded } from "./_seeded_fixtures_test.ts";
import {
  digestProbe,
  idDigestKey,
  LookupDigest,
  MAX_DIGEST_BITS,
  nameDigestKey,
} from "./lookup_digest.ts";
import { checkInSchema } from "./schemas.ts";

Deno.test("a digest of 10,000 keys has no false negatives and about 1% false positives", () => {
  const random = seeded(16);
  const held: string[] = [];
  for (let i = 0; i < 5_000; i++) {
    const suffix = Math.floor(random() * 1e12).toString(36);
    held.push(nameDigestKey("default", `agent-${suffix}`), idDigestKey(`sbx_${suffix}`));
  }
  const digest = LookupDigest.fromWire(
    (() => {
      const d = LookupDigest.sized(held.length);
      for (const k of held) d.add(k);
      return d.toWire();
    })(),
  );
  for (const k of held) assert.equal(digest.mayHold(k), true, `false negative for ${k}`);
  let positives = 0;
  const trials = 100_000;
  for (let i = 0; i < trials; i++) {
    if (digest.mayHold(nameDigestKey("red", `absent-${i}`))) positives++;
  }
  const rate = positives / trials;
  // Sized for 1%: the seeded set measures 0.9–1.1%; 1.5% would mean the hashes cluster.
  assert.ok(rate > 0.002 && rate < 0.015, `false positive rate ${rate}`);
  // About 1.2 bytes per key, as base64 on the wire 1.6.
  const bytes = digest.toWire().bits.length * 3 / 4;
  assert.ok(bytes / held.length < 1.25, `${bytes / held.length} bytes per key`);
});

Deno.test("a probe hashed once answers like mayHold", () => {
  const d = LookupDigest.sized(3);
  d.add(idDigestKey("sbx_a"));
  assert.equal(d.mayHoldProbe(digestProbe(idDigestKey("sbx_a"))), true);
  assert.equal(d.count, 1);
});

Deno.test("an empty node's digest holds nothing and is 8 bytes", () => {
  const wire = LookupDigest.sized(0).toWire();
  assert.equal(atob(wire.bits).length, 8);
  const d = LookupDigest.fromWire(wire);
  assert.equal(d.mayHold(nameDigestKey(undefined, "agent-1")), false);
});

Deno.test("fromWire refuses bits that are not base64 or out of size", () => {
  assert.throws(
    () => LookupDigest.fromWire({ bits: "!!!!", hashes: 7, count: 0 }),
    /not base64/,
  );
  assert.throws(
    () => LookupDigest.fromWire({ bits: btoa("abc"), hashes: 7, count: 0 }),
    /must hold 8 to/,
  );
  assert.ok(MAX_DIGEST_BITS / 8 === 1024 * 1024);
});

Deno.test("a check-in's digest is optional and checked by the schema", () => {
  const base = {
    nodeId: "node-a",
    endpoint: "http://10.0.0.1:3676",
    intervalSeconds: 15,
    build: "test",
    reading: {
      takenAt: 0,
      cpuCount: 4,
      cpuUsedPct: 10,
      memoryTotalBytes: 16e9,
      memoryAvailableBytes: 8e9,
      swapTotalBytes: 0,
      swapFreeBytes: 0,
      dataDisk: { path: "/data", totalBytes: 100e9, usedBytes: 20e9, availableBytes: 80e9 },
      sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    },
  };
  assert.equal(checkInSchema.safeParse(base).success, true);
  const digest = LookupDigest.sized(1).toWire();
  assert.equal(checkInSchema.safeParse({ ...base, lookupDigest: digest }).success, true);
  const bad = checkInSchema.safeParse({ ...base, lookupDigest: { ...digest, hashes: 99 } });
  assert.equal(bad.success, false);
  const huge = checkInSchema.safeParse({
    ...base,
    lookupDigest: { ...digest, bits: "A".repeat(2 * 1024 * 1024) },
  });
  assert.equal(huge.success, false);
});
