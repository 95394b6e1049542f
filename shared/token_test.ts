import assert from "node:assert/strict";
import { bearerToken, tokensEqual } from "./token.ts";

Deno.test("tokensEqual() accepts equal secrets and refuses any difference", () => {
  const t = "s".repeat(40);
  assert.equal(tokensEqual(t, t), true);
  assert.equal(tokensEqual(t.slice(0, 39), t), false);
  assert.equal(tokensEqual(t + "s", t), false);
  assert.equal(tokensEqual("t" + t.slice(1), t), false);
  assert.equal(tokensEqual("", t), false);
  assert.equal(tokensEqual("é", "e"), false);
});

Deno.test("bearerToken() reads the scheme case-insensitively and refuses others", () => {
  assert.equal(bearerToken("Bearer abc"), "abc");
  assert.equal(bearerToken("bearer  abc "), "abc");
  assert.equal(bearerToken("Basic abc"), undefined);
  assert.equal(bearerToken(null), undefined);
  assert.equal(bearerToken("Bearer"), undefined);
});
