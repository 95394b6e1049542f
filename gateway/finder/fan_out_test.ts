import assert from "node:assert/strict";
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder } from "./finder.ts";
import { checkIn } from "../_fixtures_test.ts";
import { manualTimers, TOKEN } from "./_fixtures_test.ts";
import { boundedFanOut, workerSignals } from "./fan_out.ts";
import { FakeClock } from "../../shared/clock.ts";
import { markFetchShaped } from "../../shared/fetch_handler.ts";

/**
 * `n` nodes, and a fetch that records how many lookups are in flight at once; each answer moves
 * `clock` on by `tickMs` (a node answering late, on the Finder's injected clock).
 */
function wideFleet(n: number, answer: "absent" | "hang", clock?: FakeClock, tickMs = 0) {
  const fleet = new Fleet();
  for (let i = 0; i < n; i++) {
    fleet.checkIn(checkIn(`n${i}`, `http://10.1.${i >> 8}.${i & 255}:3676`));
  }
  let inFlight = 0, peak = 0, asked = 0;
  const signals = new Set<AbortSignal>();
  const fn = (async (input: RequestInfo | URL, init?: RequestInit) => {
    ({ url: input, init } = await plainArgs(input, init));
    asked++;
    signals.add(init!.signal!);
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
      clock?.tick(tickMs);
      return Response.json({ found: false });
    } finally {
      inFlight--;
    }
  }) as typeof fetch;
  // Fetch-shaped, as the gateway's node client is: the Finder's signal reaches it as it was given.
  return { fleet, fetch: markFetchShaped(fn), peak: () => peak, asked: () => asked, signals };
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
  // One signal per worker, not one for all: each ask adds and removes a listener on its signal,
  // which costs in proportion to the listeners already there.
  assert.equal(w.signals.size, 4, "the 50 asks went out under one signal per worker");
  w.fleet.close();
});

Deno.test("Finder: a round whose first answers are slow widens once, and the next begins wider, up to the cap", async () => {
  const clock = new FakeClock(0);
  // Each answer takes the clock 10 ms on: with 4 in flight, an ask waits about 40 ms.
  const w = wideFleet(2000, "absent", clock, 10);
  const rounds: unknown[] = [];
  const finder = new Finder({
    fleet: w.fleet,
    token: TOKEN,
    fetch: w.fetch,
    clock,
    lookupConcurrency: 4,
    lookupConcurrencyMax: 200,
    timers: manualTimers().timers,
    log: (_level, message, fields) => message === "lookup round" && rounds.push(fields?.width),
  });
  assert.deepEqual(await finder.lookup("name", "first"), { kind: "none" });
  // Nothing timed before it: it begins at the configured 4, and its first 4 answers (40 ms each)
  // call for 1,996 nodes × 40 ms in half of the 1,960 ms left: 82 at once.
  assert.equal(w.peak(), 82, `${w.peak()} lookups were in flight at once in the first round`);
  // The answers at 82 in flight took about 820 ms: the next round begins at the cap, 200 (and
  // at the cap there is nothing to widen to).
  assert.deepEqual(await finder.lookup("name", "second"), { kind: "none" });
  assert.equal(w.peak(), 200, `${w.peak()} lookups were in flight at once`);
  assert.deepEqual(rounds, [82, 200], "each round's debug line names its widest");
  assert.equal(w.asked(), 4000, "every node asked in both rounds");
  w.fleet.close();
});

Deno.test("Finder refuses a lookupConcurrencyMax below lookupConcurrency", () => {
  const fleet = new Fleet();
  assert.throws(
    () => new Finder({ fleet, token: TOKEN, lookupConcurrency: 8, lookupConcurrencyMax: 4 }),
    /'lookupConcurrencyMax' must be an integer of at least 'lookupConcurrency' \(8\): received 4/,
  );
  fleet.close();
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

Deno.test("boundedFanOut with late answers at the abort without waiting for the asks in flight", async () => {
  const controller = new AbortController();
  let release!: () => void;
  const held = new Promise<void>((resolve) => release = resolve);
  let asked = 0;
  const answers = await boundedFanOut(
    [1, 2, 3, 4, 5],
    2,
    controller.signal,
    async (n) => {
      asked++;
      if (n === 3) controller.abort();
      if (n >= 2) await held; // in flight at the abort, answering only later
      return n * 10;
    },
    (n) => -n,
    (n) => n + 0.5,
  );
  assert.deepEqual(answers, [10, 2.5, 3.5, -4, -5]);
  assert.equal(asked, 3, "nobody asked after the abort");
  release();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.deepEqual(answers, [10, 2.5, 3.5, -4, -5], "a late answer does not change the result");
  assert.equal(asked, 3, "the workers stop once their ask ends");
});

Deno.test("boundedFanOut with widen re-sizes once after its first answers, and never narrows", async () => {
  const run = async (wanted: number) => {
    let inFlight = 0, peak = 0;
    const calls: number[] = [];
    const workers = new Set<number>();
    const answers = await boundedFanOut(
      Array.from({ length: 40 }, (_, i) => i),
      2,
      new AbortController().signal,
      async (n, worker) => {
        workers.add(worker);
        peak = Math.max(peak, ++inFlight);
        await new Promise((resolve) => setTimeout(resolve, 0));
        inFlight--;
        return n;
      },
      () => -1,
      undefined,
      { after: 2, to: (left) => (calls.push(left), wanted) },
    );
    return { answers, peak, calls, workers: workers.size };
  };
  const wider = await run(6);
  assert.deepEqual(wider.answers, Array.from({ length: 40 }, (_, i) => i), "every item, in order");
  // The first worker took the third item when its answer came, before the second answer did.
  assert.deepEqual(wider.calls, [37], "asked once, after 2 answers, with 37 items not yet asked");
  assert.equal(wider.peak, 6);
  assert.equal(wider.workers, 6, "the new workers are numbered on from the first ones");
  const narrower = await run(1);
  assert.equal(narrower.peak, 2, "a narrower width changes nothing");
  assert.equal(narrower.calls.length, 1);
});

Deno.test("boundedFanOut with widen starts no worker after the signal aborted", async () => {
  const controller = new AbortController();
  let calls = 0, asked = 0;
  const answers = await boundedFanOut(
    [1, 2, 3, 4, 5],
    1,
    controller.signal,
    (n) => {
      asked++;
      controller.abort();
      return Promise.resolve(n);
    },
    (n) => -n,
    undefined,
    { after: 1, to: () => (calls++, 8) },
  );
  assert.deepEqual(answers, [1, -2, -3, -4, -5]);
  assert.equal(asked, 1);
  assert.equal(calls, 0, "an aborted fan-out is not re-sized");
});

Deno.test("workerSignals gives each worker one signal of its own that follows the fan-out's", () => {
  const controller = new AbortController();
  const signalOf = workerSignals(controller.signal);
  assert.equal(signalOf(0), signalOf(0));
  assert.notEqual(signalOf(0), signalOf(1));
  controller.abort(new Error("deadline"));
  assert.ok(signalOf(0).aborted && signalOf(1).aborted && signalOf(7).aborted);
});
