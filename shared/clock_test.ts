import assert from "node:assert/strict";
import { FakeClock } from "./clock.ts";

Deno.test("FakeClock.tick() fires due timers at their own moment, earliest first", () => {
  const clock = new FakeClock(0);
  const fired: string[] = [];
  clock.setTimer(() => fired.push(`b@${clock.now()}`), 200);
  clock.setTimer(() => fired.push(`a@${clock.now()}`), 100);
  const late = clock.setTimer(() => fired.push("never"), 1000);
  // A timer set by a timer fires in the same tick when it falls due inside it.
  clock.setTimer(() => clock.setTimer(() => fired.push(`c@${clock.now()}`), 50), 120);
  clock.clearTimer(late);
  clock.tick(500);
  assert.deepEqual(fired, ["a@100", "c@170", "b@200"]);
  assert.equal(clock.now(), 500);
  assert.equal(clock.pendingTimers, 0);
});

Deno.test("FakeClock.tick() leaves a timer that is not due yet", () => {
  const clock = new FakeClock(0);
  let fired = false;
  clock.setTimer(() => fired = true, 100);
  clock.tick(99);
  assert.equal(fired, false);
  assert.equal(clock.pendingTimers, 1);
  clock.tick(1);
  assert.equal(fired, true);
});
