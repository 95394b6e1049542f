import assert from "node:assert/strict";
import { describeFetchFailure } from "./fetch_failure.ts";

Deno.test("describeFetchFailure() names a timeout with the caller's bound, or without one", () => {
  const timeout = new DOMException("signal timed out", "TimeoutError");
  assert.equal(describeFetchFailure(timeout, 250), "timeout: no answer within 250 ms");
  assert.equal(describeFetchFailure(timeout), "timeout: no answer in time");
});

Deno.test("describeFetchFailure() reads the code of a Node-style cause", () => {
  const refused = new TypeError("fetch failed", { cause: { code: "ECONNREFUSED" } });
  assert.equal(
    describeFetchFailure(refused),
    "ECONNREFUSED: nothing listens at that address and port",
  );
  const reset = new TypeError("fetch failed", { cause: { code: "ECONNRESET" } });
  assert.equal(describeFetchFailure(reset), "ECONNRESET: the connection was reset");
  const dns = new TypeError("fetch failed", { cause: new Error("getaddrinfo ENOTFOUND x.test") });
  assert.match(describeFetchFailure(dns), /^DNS: the host name does not resolve \(fetch failed/);
});

Deno.test("describeFetchFailure() cuts an unknown error's text", () => {
  assert.equal(describeFetchFailure(new Error("x".repeat(500))).length, 401);
  assert.equal(describeFetchFailure("plain words"), "plain words");
});
