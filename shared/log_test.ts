import assert from "node:assert/strict";
import { ChangeLog, createLog, parseLogLevel, redact } from "./log.ts";

Deno.test("createLog() writes one JSON line per event and honours the level", () => {
  const lines: string[] = [];
  const log = createLog({ level: "info", write: (l) => lines.push(l) });
  log("debug", "hidden");
  log("warn", "node moved", { nodeId: "a", from: "http://x", to: "http://y" });
  assert.equal(lines.length, 1);
  const event = JSON.parse(lines[0]);
  assert.equal(event.level, "warn");
  assert.equal(event.msg, "node moved");
  assert.equal(event.nodeId, "a");
});

Deno.test("redact() keeps tokens, bearer values and signatures out of log lines", () => {
  const out = redact({
    apiToken: "s3cret",
    header: "Bearer abcdef",
    url: "http://x/files?path=/a&signature=v1_abc",
    envdAccessToken: "t",
    fine: "hello",
  });
  const text = JSON.stringify(out);
  assert.doesNotMatch(text, /s3cret|abcdef|v1_abc/);
  assert.equal(out.fine, "hello");
});

Deno.test("parseLogLevel() names the variable and the choices for a bad value", () => {
  assert.equal(parseLogLevel(undefined), "info");
  assert.equal(parseLogLevel("debug"), "debug");
  const bad = parseLogLevel("loud");
  assert.ok(bad instanceof Error);
  assert.match(bad.message, /DORMICE_LOG_LEVEL='loud'.*debug, info, warn, error/);
});

Deno.test("ChangeLog.report() logs a repeated condition once per change", () => {
  const seen: string[] = [];
  const changes = new ChangeLog((_l, msg) => seen.push(msg));
  changes.report("k", "A", "warn", "a");
  changes.report("k", "A", "warn", "a again");
  changes.report("k", "B", "warn", "b");
  changes.report("k", "A", "warn", "a back");
  assert.deepEqual(seen, ["a", "b", "a back"]);
});
