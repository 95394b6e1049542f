import assert from "node:assert/strict";
import { bearerBytesCheck, callerCheck, OPERATOR } from "./auth.ts";
import { ApiKeys } from "./keys.ts";
import { bearerToken } from "../../shared/token.ts";

/** One byte a character, as a header's value comes. */
const bytesOf = (text: string) => Uint8Array.from(text, (c) => c.charCodeAt(0));

Deno.test("bearerBytesCheck() names the caller identify() names for every header, near misses included", () => {
  const keys = new ApiKeys();
  try {
    const token = "f".repeat(31) + "Z";
    const identify = callerCheck(token, keys);
    const check = bearerBytesCheck(token, identify);
    const key = keys.create({ team: "acme" }).key;
    const headers = [
      `Bearer ${token}`,
      `bearer ${token}`,
      `BEARER ${token}`,
      `Bearer  ${token}`,
      `Bearer\t${token}`,
      `Bearer ${token.slice(0, -1)}z`,
      `Bearer ${token.slice(0, -1)}`,
      `Bearer ${token}Z`,
      `Bearez ${token}`,
      `Basic ${token}`,
      `Bearer ${key}`,
      `Bearer ${key.slice(0, -1)}`,
      `Bearer ${token.slice(0, 16)}\u00ff${token.slice(17)}`,
      "",
      "Bearer",
    ];
    for (const h of headers) {
      const b = bytesOf(` ${h} `);
      assert.deepEqual(check(b, 1, b.length - 1), identify(bearerToken(h)), JSON.stringify(h));
    }
    assert.equal(check(bytesOf(`Bearer ${token}`), 0, token.length + 7), OPERATOR);
    assert.equal(check(bytesOf(`Bearer ${key}`), 0, key.length + 7)?.kind, "key");
    // A token with a character the fast path does not read as a byte is still checked, as text.
    const wide = "\u00e9".repeat(32);
    const wideCheck = bearerBytesCheck(wide, callerCheck(wide, keys));
    const text = `Bearer ${wide}`;
    assert.deepEqual(
      wideCheck(bytesOf(text), 0, text.length),
      callerCheck(wide, keys)(bearerToken(text)),
    );
  } finally {
    keys.close();
  }
});
