import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { AccessTokens } from "../../../shared/access_tokens.ts";
import { signUpload, UPLOAD_TOKEN_TTL_MS, verifyUpload } from "./template_upload.ts";

const keys = AccessTokens.fromFleetToken("a fleet token of at least 32 characters!!");
const grant = { node: "n1", build: "b1", team: "équipe", hash: "c".repeat(64) };
const now = 1_800_000_000_000;

Deno.test("upload tokens: signed for one template under the fleet's secret", () => {
  const token = signUpload(keys, "snap-1", grant, now);
  assert.deepEqual(verifyUpload(keys, "snap-1", token, now), grant);
  assert.deepEqual(
    verifyUpload(
      AccessTokens.fromFleetToken("a fleet token of at least 32 characters!!"),
      "snap-1",
      token,
      now,
    ),
    grant,
    "another gateway of the fleet (or this one restarted) reads it",
  );
  assert.equal(verifyUpload(keys, "snap-2", token, now), undefined, "another template's");
  const other = AccessTokens.fromFleetToken("another fleet token of at least 32 chars!!");
  assert.equal(verifyUpload(other, "snap-1", token, now), undefined, "another fleet's");
  const [payload, mac] = token.split(".");
  const forged = Buffer.from(JSON.stringify(["n2", "b1", "équipe", grant.hash])).toString(
    "base64url",
  );
  assert.equal(verifyUpload(keys, "snap-1", `${forged}.${mac}`, now), undefined, "a changed grant");
  for (const bad of ["", payload, `${payload}.${mac}.x`, "x".repeat(3000), `${payload}.AAAA`]) {
    assert.equal(verifyUpload(keys, "snap-1", bad, now), undefined, bad.slice(0, 40));
  }
});

Deno.test("upload tokens: good for an hour after they were issued, and no token without a bound", () => {
  const token = signUpload(keys, "snap-1", grant, now);
  assert.deepEqual(verifyUpload(keys, "snap-1", token, now + UPLOAD_TOKEN_TTL_MS - 1), grant);
  assert.equal(verifyUpload(keys, "snap-1", token, now + UPLOAD_TOKEN_TTL_MS), "expired");
  assert.equal(verifyUpload(keys, "snap-1", token, now + 365 * 86_400_000), "expired");
  // Issued by a gateway whose clock ran days ahead: not good for days here.
  const ahead = signUpload(keys, "snap-1", grant, now + 3 * 86_400_000);
  assert.equal(verifyUpload(keys, "snap-1", ahead, now), "expired");
  // A token signed without an expiry (as they were first issued) is not one.
  const payload = Buffer.from(JSON.stringify(["n1", "b1", "équipe", grant.hash])).toString(
    "base64url",
  );
  const label = "dormice template upload v1\u0000";
  const unbounded = `${payload}.${keys.forSandbox(`${label}snap-1\u0000${payload}`)}`;
  assert.equal(verifyUpload(keys, "snap-1", unbounded, now), undefined);
  for (const expires of [null, "9999999999999", 1e300, -1]) {
    const p = Buffer.from(JSON.stringify(["n1", "b1", "t", grant.hash, expires])).toString(
      "base64url",
    );
    const t = `${p}.${keys.forSandbox(`${label}snap-1\u0000${p}`)}`;
    assert.notEqual(typeof verifyUpload(keys, "snap-1", t, now), "object", String(expires));
  }
});
