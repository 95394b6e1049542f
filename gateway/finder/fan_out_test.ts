import assert from "node:assert/strict";
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder } from "./finder.ts";
import { checkIn } from "../_fixtures_test.ts";
import { manualTimers, TOKEN } from "./_fixtures_test.ts";
import { boundedFanOut } from "./fan_out.ts";

/** `n` nodes, and a fetch that records how many lookups are in flight at once. */
function wideFleet(n: number, answer: "absent" | "hang") {
  const fleet = new Fleet();
  for (let i = 0; i < n; i++) {
    fleet.checkIn(checkIn(`n${i}`, `http://10.1.${i >> 8}.${i & 255}:3676`));
  }
  let inFlight = 0, peak = 0, asked = 0;
  const fn = (async (input: RequestInfo | URL, init?: RequestInit) => {
    ({ url: input, init } = await plainArgs(input, init));
    asked++;
    peak = Math.max(peak, ++inFlight);
    try {
      if (answer === "hang") {
        return await new Promise<Response>((_, reject) => {
          const signal = init!.signal!;
          if (signal.aborted) reject(signal.reason);
          signal.addEventListener("abort", () => reject(signal.reason), { once: true });
        });
      }
      await Promise.resolve();
      return Response.json({ found: false });
    } finally {
      inFlight--;
    }
  }) as typeof fetch;
  return { fleet, fetch: fn, peak: () => peak, asked: () => asked };
}

Deno.test("Finder: a round asks at most lookupConcurrency nodes at once, and hears them all", async () => {
  const w = wideFleet(50, "absent");
  const finder = new Finder({
    fleet: w.fleet,
    token: TOKEN,
    fetch: w.fetch,
    lookupConcurrency: 4,
    timers: manualTimers().timers,
  });
  assert.deepEqual(await finder.lookup("name", "nobody"), { kind: "none" });
  assert.equal(w.asked(), 50, "every node asked");
  assert.ok(w.peak() <= 4, `${w.peak()} lookups were in flight at once`);
  assert.ok(w.peak() > 1, "the round still asks in parallel");
  w.fleet.close();
});

Deno.test("Finder: nodes not asked before the deadline make the round unsure, and it says so", async () => {
  const w = wideFleet(10, "hang");
  const t = manualTimers();
  const finder = new Finder({
    fleet: w.fleet,
    token: TOKEN,
    fetch: w.fetch,
    lookupConcurrency: 3,
    timers: t.timers,
  });
  const round = finder.lookup("name", "nobody");
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(w.asked(), 3, "three asked, the others wait their turn");
  t.fireAll(); // the round's deadline
  const r = await round;
  assert.equal(r.kind, "unsure");
  if (r.kind !== "unsure") return;
  assert.equal(r.silent.length, 10);
  assert.equal(w.asked(), 3, "nobody is asked after the deadline");
  assert.match(r.message, /7 nodes were not asked before the round's deadline/);
  assert.match(r.message, /DORMICE_GATEWAY_LOOKUP_CONCURRENCY/);
  assert.match(r.message, /'n0' \(http:\/\/10\.1\.0\.0:3676: No answer within 2000 ms\)/);
  w.fleet.close();
});

Deno.test("Finder refuses a lookupConcurrency that is not a positive integer", () => {
  const fleet = new Fleet();
  assert.throws(
    () => new Finder({ fleet, token: TOKEN, lookupConcurrency: 0 }),
    /'lookupConcurrency' must be a positive integer: received 0/,
  );
  fleet.close();
});

Deno.test("boundedFanOut keeps order and answers the unasked at once when the signal aborts", async () => {
  const controller = new AbortController();
  const answers = await boundedFanOut([1, 2, 3, 4], 2, controller.signal, (n) => {
    if (n === 2) controller.abort();
    return Promise.resolve(n * 10);
  }, (n) => -n);
  assert.deepEqual(answers, [10, 20, -3, -4]);
});
