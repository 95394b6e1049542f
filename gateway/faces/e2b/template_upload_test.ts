import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { AccessTokens } from "../../../shared/access_tokens.ts";
import { signUpload, verifyUpload } from "./template_upload.ts";

const keys = AccessTokens.fromFleetToken("a fleet token of at least 32 characters!!");
const grant = { node: "n1", build: "b1", team: "équipe", hash: "c".repeat(64) };

Deno.test("upload tokens: signed for one template under the fleet's secret", () => {
  const token = signUpload(keys, "snap-1", grant);
  assert.deepEqual(verifyUpload(keys, "snap-1", token), grant);
  assert.deepEqual(
    verifyUpload(
      AccessTokens.fromFleetToken("a fleet token of at least 32 characters!!"),
      "snap-1",
      token,
    ),
    grant,
    "another gateway of the fleet (or this one restarted) reads it",
  );
  assert.equal(verifyUpload(keys, "snap-2", token), undefined, "another template's");
  const other = AccessTokens.fromFleetToken("another fleet token of at least 32 chars!!");
  assert.equal(verifyUpload(other, "snap-1", token), undefined, "another fleet's");
  const [payload, mac] = token.split(".");
  const forged = Buffer.from(JSON.stringify(["n2", "b1", "équipe", grant.hash])).toString(
    "base64url",
  );
  assert.equal(verifyUpload(keys, "snap-1", `${forged}.${mac}`), undefined, "a changed grant");
  for (const bad of ["", payload, `${payload}.${mac}.x`, "x".repeat(3000), `${payload}.AAAA`]) {
    assert.equal(verifyUpload(keys, "snap-1", bad), undefined, bad.slice(0, 40));
  }
});
