import assert from "node:assert/strict";
import { FakeClock } from "../../shared/clock.ts";
import { LATENCY_SAMPLES, RoundWidth } from "./round_width.ts";

/** `count` asks that each answer `ms` later on `clock`, timed by `width`. */
async function answerAfter(width: RoundWidth, clock: FakeClock, ms: number, count: number) {
  const ask = width.timed(async (_: number) => {
    await Promise.resolve();
    clock.tick(ms);
    return "absent";
  });
  for (let i = 0; i < count; i++) await ask(i);
}

Deno.test("RoundWidth: the configured width until an answer was timed", () => {
  const width = new RoundWidth({ floor: 128, ceiling: 1024, clock: new FakeClock(0) });
  assert.equal(width.latencyMs, undefined);
  assert.equal(width.width(10_000, 2000), 128);
  assert.equal(width.width(50, 2000), 50);
});

Deno.test("RoundWidth: 10,000 nodes answering 40 ms late fit in half the deadline", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 128, ceiling: 1024, clock });
  await answerAfter(width, clock, 40, 200);
  assert.equal(width.latencyMs, 40);
  // 10,000 × 40 ms ÷ (0.5 × 2,000 ms) = 400 asks at once: the fleet in 1 s.
  assert.equal(width.width(10_000, 2000), 400);
  // With less time left (a list asked later in the round), wider.
  assert.equal(width.width(10_000, 1000), 800);
  // Never wider than the ceiling, nor than the list.
  assert.equal(width.width(10_000, 100), 1024);
  assert.equal(width.width(300, 10), 300);
});

Deno.test("RoundWidth: fast answers keep the configured width as the least", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 128, ceiling: 1024, clock });
  await answerAfter(width, clock, 2, 100);
  // 10,000 × 2 ms ÷ 1,000 ms = 20, below the floor.
  assert.equal(width.width(10_000, 2000), 128);
});

Deno.test("RoundWidth: the fastest tenth of the recent answers, the oldest forgotten", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 16, ceiling: 4096, clock });
  // Answers slowed by the gateway's own queue (most of them) do not widen the next round.
  await answerAfter(width, clock, 10, 15);
  await answerAfter(width, clock, 1000, 85);
  assert.equal(width.latencyMs, 10);
  // The network got slower: once every recent answer is slow, so is the fastest tenth.
  await answerAfter(width, clock, 50, LATENCY_SAMPLES);
  assert.equal(width.latencyMs, 50);
  assert.equal(width.width(10_000, 2000), 500);
});

Deno.test("RoundWidth: a silent ask's time is not kept", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 128, ceiling: 1024, clock });
  const ask = width.timed(
    async (kind: string) => {
      await Promise.resolve();
      clock.tick(2000); // the deadline's time, not the node's
      return kind;
    },
    (answer) => answer !== "silent",
  );
  await ask("silent");
  assert.equal(width.latencyMs, undefined);
  await ask("absent");
  assert.equal(width.latencyMs, 2000);
});

Deno.test("RoundWidth refuses widths that are not positive integers", () => {
  const clock = new FakeClock(0);
  assert.throws(
    () => new RoundWidth({ floor: 0, ceiling: 10, clock }),
    /'floor' must be a positive integer: received 0/,
  );
  assert.throws(
    () => new RoundWidth({ floor: 128, ceiling: 64, clock }),
    /'ceiling' must be an integer of at least 'floor' \(128\): received 64/,
  );
  assert.throws(
    () => new RoundWidth({ floor: 1, ceiling: 2, clock, share: 0 }),
    /'share' must be above 0 and at most 1: received 0/,
  );
});
