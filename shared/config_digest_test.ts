import assert from "node:assert/strict";
import { configDigest } from "./config_digest.ts";

const token = "t".repeat(32);
const base = {
  templates: { base: "dormice-base:latest" },
  sandboxDomain: null,
  signingSecretId: "x",
};

Deno.test("configDigest(): the egress CA sets a node apart; without one the digest is unchanged", () => {
  const none = configDigest(base, token);
  assert.equal(configDigest({ ...base, egressCa: null }, token), none);
  const a = configDigest({ ...base, egressCa: "a".repeat(64) }, token);
  const b = configDigest({ ...base, egressCa: "b".repeat(64) }, token);
  assert.notEqual(a, none);
  assert.notEqual(a, b);
  assert.equal(configDigest({ ...base, egressCa: "a".repeat(64) }, token), a);
});

Deno.test("configDigest(): E2B's default egress on sets a node apart; off keeps the digest", () => {
  const none = configDigest(base, token);
  assert.equal(configDigest({ ...base, e2bDefaultEgress: false }, token), none);
  assert.notEqual(configDigest({ ...base, e2bDefaultEgress: true }, token), none);
});
