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

Deno.test("RoundWidth.rewidth: a round's own first answers, not the history, size its one re-size", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 128, ceiling: 1024, clock });
  await answerAfter(width, clock, 1, 1000); // fast rounds before
  assert.equal(width.width(10_000, 2000), 128);
  // The round's first 128 answers came 40 ms late: 9,872 nodes left × 40 ms in half of 1,950 ms.
  assert.equal(width.rewidth(new Array(128).fill(40), 9_872, 1_950), 406);
  // Bounded by the ceiling however little time is left; the floor when nothing was timed.
  assert.equal(width.rewidth([40], 9_872, 10), 1024);
  assert.equal(width.rewidth([], 9_872, 1_950), 128);
});

Deno.test("RoundWidth.firstAnswers keeps one round's latencies and offers no re-size at the ceiling", async () => {
  const clock = new FakeClock(0);
  const width = new RoundWidth({ floor: 4, ceiling: 64, clock });
  const first = width.firstAnswers();
  const ask = width.timed(
    async (ms: number) => {
      await Promise.resolve();
      clock.tick(ms);
      return ms;
    },
    () => true,
    first.add,
  );
  for (let i = 0; i < 4; i++) await ask(40);
  const widen = first.widen(4, () => 1000)!;
  assert.equal(widen.after, 4, "after one answer per worker");
  // 100 nodes left × 40 ms in half of 1,000 ms.
  assert.equal(widen.to(100), 8);
  assert.equal(first.widen(64, () => 1000), undefined);
});
