import assert from "node:assert/strict";
import { bearerToken, tokenMatcher, tokensEqual } from "./token.ts";

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

Deno.test("bearerToken() reads every header as the pattern it is defined by does", () => {
  // The plain shape is read without the pattern: each header here must come out as the pattern
  // reads it, the near misses of that shape above all.
  const byPattern = (h: string) => /^Bearer\s+(.+)$/i.exec(h.trim())?.[1].trim();
  const headers = [
    "Bearer abc",
    "BEARER abc",
    "bEaReR x",
    "Bearer ab c",
    "Bearer  abc",
    "Bearer\tabc",
    "Bearer abc ",
    " Bearer abc",
    "Bearer é",
    "Bearer a\u00a0",
    "Bearer a\nb",
    "Bearer a\u2028",
    "Bearerabc",
    "Bearer ",
    "Bearer !~",
    "Bearez abc",
    "Bearer\u0000abc",
    "Bearer a\u007f",
    `Bearer ${"k".repeat(48)}`,
  ];
  for (const h of headers) assert.equal(bearerToken(h), byPattern(h), JSON.stringify(h));
});

Deno.test("tokenMatcher() accepts the secret it was built for and refuses any difference", () => {
  const matches = tokenMatcher("a".repeat(32));
  assert.equal(matches("a".repeat(32)), true);
  assert.equal(matches("a".repeat(31) + "b"), false);
  assert.equal(matches("a".repeat(31)), false);
  assert.equal(matches("a".repeat(33)), false);
  assert.equal(matches(""), false);
  assert.equal(tokenMatcher("é".repeat(4))("é".repeat(4)), true);
});
