import assert from "node:assert/strict";
import { CapabilitiesReader } from "./capabilities_reader.ts";
import type { ExecutorCapabilities } from "./executors/contract.ts";

function recorder() {
  const lines: { level: string; msg: string; error?: unknown }[] = [];
  return {
    lines,
    log: (level: string, msg: string, fields?: Record<string, unknown>) =>
      void lines.push({ level, msg, error: fields?.error }),
  };
}

Deno.test("CapabilitiesReader.refresh() logs an engine outage once per cause and its recovery once", async () => {
  const answer: ExecutorCapabilities = { templates: ["base"], volumes: [] };
  let failure: Error | undefined;
  const { lines, log } = recorder();
  const reader = new CapabilitiesReader(
    () => failure ? Promise.reject(failure) : Promise.resolve(answer),
    log,
  );
  await reader.refresh();
  assert.deepEqual(reader.current, answer);
  assert.equal(lines.length, 0);
  // Twenty check-ins during an outage: one warning, and the last answer is kept.
  failure = new Error("connect ECONNREFUSED /var/run/docker.sock");
  for (let i = 0; i < 20; i++) await reader.refresh();
  assert.deepEqual(lines.map((l) => l.level), ["warn"]);
  assert.match(lines[0].msg, /^could not read the executor's templates and volumes/);
  assert.equal(lines[0].error, "connect ECONNREFUSED /var/run/docker.sock");
  assert.deepEqual(reader.current, answer);
  // Another cause is news: one more warning.
  failure = new Error("engine answered 500");
  for (let i = 0; i < 5; i++) await reader.refresh();
  assert.equal(lines.length, 2);
  assert.equal(lines[1].error, "engine answered 500");
  // Recovered: said once, then quiet.
  failure = undefined;
  for (let i = 0; i < 5; i++) await reader.refresh();
  assert.deepEqual(lines.map((l) => l.level), ["warn", "warn", "info"]);
  assert.match(lines[2].msg, /can be read again/);
  // A new outage after the recovery is logged again.
  failure = new Error("connect ECONNREFUSED /var/run/docker.sock");
  await reader.refresh();
  assert.equal(lines.length, 4);
});

Deno.test("CapabilitiesReader.refresh() asks one question at a time, and nothing without the verb", async () => {
  let asked = 0;
  let release!: () => void;
  const reader = new CapabilitiesReader(() => {
    asked++;
    return new Promise((resolve) => release = () => resolve({ templates: [], volumes: [] }));
  });
  const first = reader.refresh();
  await reader.refresh();
  assert.equal(asked, 1);
  release();
  await first;
  await new CapabilitiesReader(undefined).refresh();
  assert.deepEqual(reader.current, { templates: [], volumes: [] });
});
