import assert from "node:assert/strict";
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder, widestRound } from "./finder.ts";
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

/**
 * A fan-out over `n` items whose asks each take `askMs` of a virtual clock: the test drives the
 * clock from one pending ask's end to the next, and the signal aborts at `deadlineMs`, so the
 * figures are exact and no real time passes.
 */
async function virtualFanOut(n: number, askMs: number, deadlineMs: number, maxLimit?: number) {
  let now = 0, inFlight = 0, peak = 0;
  const due: { at: number; resolve: () => void }[] = [];
  const controller = new AbortController();
  const ask = (item: number) => {
    peak = Math.max(peak, ++inFlight);
    return new Promise<number>((resolve) => {
      due.push({
        at: now + askMs,
        resolve: () => {
          inFlight--;
          resolve(item);
        },
      });
    });
  };
  const pace = maxLimit === undefined ? undefined : { now: () => now, deadlineMs, maxLimit };
  const done = boundedFanOut(
    Array.from({ length: n }, (_, i) => i),
    10,
    controller.signal,
    ask,
    () => -1,
    pace,
  );
  let finished = false;
  void done.then(() => finished = true);
  while (!finished) {
    for (let k = 0; k < 5; k++) await Promise.resolve();
    if (finished) break;
    due.sort((a, b) => a.at - b.at);
    const first = due.shift();
    if (first === undefined) {
      await new Promise((r) => setTimeout(r, 0));
      continue;
    }
    if (first.at >= deadlineMs && !controller.signal.aborted) {
      now = deadlineMs;
      controller.abort();
    }
    now = Math.max(now, first.at);
    first.resolve();
  }
  const answers = await done;
  return { asked: answers.filter((a) => a >= 0).length, peak };
}

Deno.test("boundedFanOut at a fixed width asks only what that width allows before the deadline", async () => {
  // 10 at once, 100 ms an ask, 2,000 ms: 200 of 1,000 asked.
  const r = await virtualFanOut(1_000, 100, 2_000);
  assert.equal(r.peak, 10);
  assert.ok(r.asked <= 200, `${r.asked} asked`);
});

Deno.test("boundedFanOut with a pace widens until every item is asked before the deadline", async () => {
  const r = await virtualFanOut(1_000, 100, 2_000, 80);
  assert.equal(r.asked, 1_000, "every item asked before the deadline");
  assert.ok(r.peak > 10, `the fan-out widened (peak ${r.peak})`);
  assert.ok(r.peak <= 80, `never past maxLimit (peak ${r.peak})`);
});

Deno.test("boundedFanOut with a pace stays at its width when that width is on time", async () => {
  // 100 items at 10 ms with 10 at once take 100 ms of a 2,000 ms deadline.
  const r = await virtualFanOut(100, 10, 2_000, 80);
  assert.equal(r.asked, 100);
  assert.equal(r.peak, 10);
});

Deno.test("boundedFanOut with a pace holds at maxLimit when even that is too narrow", async () => {
  const r = await virtualFanOut(10_000, 100, 2_000, 40);
  assert.equal(r.peak, 40);
  assert.ok(r.asked < 10_000 && r.asked > 400, `${r.asked} asked`);
});

Deno.test("boundedFanOut refuses a maxLimit below its limit", async () => {
  await assert.rejects(
    () =>
      boundedFanOut([1], 4, new AbortController().signal, (n) => Promise.resolve(n), () => 0, {
        now: () => 0,
        deadlineMs: 1_000,
        maxLimit: 2,
      }),
    /'maxLimit' must be an integer of at least 'limit' \(4\): received 2/,
  );
});

Deno.test("Finder: a round whose nodes answer slowly widens past lookupConcurrency to end in time", async () => {
  const fleet = new Fleet();
  for (let i = 0; i < 400; i++) {
    fleet.checkIn(checkIn(`n${i}`, `http://10.2.${i >> 8}.${i & 255}:3676`));
  }
  let now = 1_000_000, inFlight = 0, peak = 0, asked = 0;
  const slow = (async () => {
    asked++;
    peak = Math.max(peak, ++inFlight);
    await new Promise((r) => setTimeout(r, 0));
    now += 20; // every answer moves the clock on: asks look slow to the round
    inFlight--;
    return Response.json({ found: false });
  }) as typeof fetch;
  const finder = new Finder({
    fleet,
    token: TOKEN,
    fetch: slow,
    lookupConcurrency: 4,
    clock: { now: () => now },
    timers: manualTimers().timers,
  });
  assert.deepEqual(await finder.lookup("name", "nobody"), { kind: "none" });
  assert.equal(asked, 400);
  assert.ok(peak > 4, `the round widened past 4 at once (peak ${peak})`);
  assert.ok(peak <= widestRound(4), `at most ${widestRound(4)} at once (peak ${peak})`);
  assert.equal(widestRound(128), 1024);
  assert.equal(widestRound(4096), 4096);
  fleet.close();
});
