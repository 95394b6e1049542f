import assert from "node:assert/strict";
import { HangUpWatch } from "./hang_up_watch.ts";
import { HttpError } from "./http_error.ts";
import { within } from "./http1/_server_fixtures_test.ts";
import { FakeClock } from "./clock.ts";

Deno.test("HangUpWatch entry: its controller is made when asked, aborted if the entry was; its hook is told once", () => {
  const hangUps = new HangUpWatch({ tickMs: 60_000 });
  const target = { nodeId: "n", endpoint: "http://127.0.0.1:9" };
  const entry = hangUps.watch({ signal: new AbortController().signal }, target);
  let told = 0;
  entry.onAbort(() => told++);
  const reason = new Error("client gone");
  entry.abort(reason);
  entry.abort(new Error("again"));
  assert.equal(told, 1, "the hook is told of the first abort only");
  assert.equal(entry.aborted, true);
  assert.equal(entry.reason, reason);
  assert.equal(entry.signal.aborted, true, "a controller made after the abort is aborted");
  assert.equal(entry.signal.reason, reason);
  hangUps.done(entry);

  // Made before the abort, the controller is aborted with it; a cleared hook is not told.
  const other = hangUps.watch({ signal: new AbortController().signal }, target);
  const signal = other.signal;
  other.onAbort(() => told++);
  other.onAbort(undefined);
  other.abort(reason);
  assert.equal(signal.aborted, true);
  assert.equal(told, 1);
  hangUps.done(other);
});

Deno.test("HangUpWatch: forwards ending in any order leave exactly the others pending, and only those time out", async () => {
  const hangUps = new HangUpWatch({ tickMs: 1 });
  const target = { nodeId: "n", endpoint: "http://127.0.0.1:9" };
  const watch = () => hangUps.watch({ signal: new AbortController().signal }, target, 0);
  const entries = Array.from({ length: 12 }, watch);
  // Ended out of order: the middle, the last, the first, then every third of the rest.
  const ended = new Set([entries[5], entries[11], entries[0]]);
  for (const e of ended) hangUps.done(e);
  hangUps.done(entries[5]);
  assert.equal(hangUps.size, 9, "a forward ended twice is removed once");
  for (let i = 1; i < 12; i += 3) {
    if (!ended.has(entries[i])) {
      hangUps.done(entries[i]);
      ended.add(entries[i]);
    }
  }
  const pending = entries.filter((e) => !ended.has(e));
  assert.equal(hangUps.size, pending.length);
  // The head's bound starts for a pending forward only; a bound of 0 ends it at the next tick.
  for (const e of entries) hangUps.bodySent(e);
  for (const e of ended) assert.equal(e.deadline, Infinity, "an ended forward gets no bound");
  const timedOut = pending.map((e) => new Promise<void>((resolve) => e.onAbort(resolve)));
  await within(Promise.all(timedOut), 5000, "the pending forwards' 504s");
  for (const e of pending) {
    assert.ok(e.reason instanceof HttpError && e.reason.status === 504, String(e.reason));
  }
  for (const e of ended) assert.equal(e.aborted, false, "an ended forward is not aborted");
  assert.equal(hangUps.size, 0);
});

/** A client request that never hangs up. */
const staying = () => ({ signal: new AbortController().signal });

/** A forward started and answered each millisecond, for `ms` or until `stop` says so. */
function steady(hangUps: HangUpWatch, clock: FakeClock, ms: number, stop = () => false): void {
  const target = { nodeId: "n", endpoint: "http://127.0.0.1:9" };
  for (let i = 0; i < ms && !stop(); i++) {
    clock.tick(1);
    hangUps.done(hangUps.watch(staying(), target, 50, clock.now()));
  }
}

/** A fake clock that also notes the delay of each timer set on it. */
function notingClock(): { clock: FakeClock; delays: number[] } {
  const clock = new FakeClock(0);
  const delays: number[] = [];
  const setTimer = clock.setTimer.bind(clock);
  clock.setTimer = (fn, ms) => {
    delays.push(ms);
    return setTimer(fn, ms);
  };
  return { clock, delays };
}

Deno.test("HangUpWatch: while forwards keep starting, they run the ticks and the timer waits busyTimerMs", () => {
  const { clock, delays } = notingClock();
  const hangUps = new HangUpWatch({ clock, tickMs: 10, busyTimerMs: 250 });
  const target = { nodeId: "n", endpoint: "http://127.0.0.1:9" };
  const client = new AbortController();
  const long = hangUps.watch(client, target, 50, clock.now());
  hangUps.bodySent(long, clock.now());
  // A forward a millisecond for 40 ms, each answered at once.
  steady(hangUps, clock, 40);
  assert.equal(long.linked, true, "the pending forward was tied to its client on a tick");
  client.abort(new Error("client gone"));
  assert.equal(long.aborted, true, "the hang-up reached the node's request");
  // Its bound is checked by the forwards too: the 504 comes within a tick of it.
  const timed = hangUps.watch(staying(), target, 30, clock.now());
  hangUps.bodySent(timed, clock.now());
  steady(hangUps, clock, 40, () => timed.aborted);
  assert.ok(timed.reason instanceof HttpError && timed.reason.status === 504, String(timed.reason));
  // The first timer waited a tick; once it found the forwards ticking, it waited longer.
  assert.deepEqual(delays, [10, 250]);
  assert.equal(clock.pendingTimers, 1);
});

Deno.test("HangUpWatch: a forward left pending when the others stop is checked within busyTimerMs, then every tick", () => {
  const { clock, delays } = notingClock();
  const hangUps = new HangUpWatch({ clock, tickMs: 10, busyTimerMs: 250 });
  const target = { nodeId: "n", endpoint: "http://127.0.0.1:9" };
  steady(hangUps, clock, 30);
  const left = hangUps.watch(staying(), target, 20, clock.now());
  hangUps.bodySent(left, clock.now());
  const at = clock.now();
  clock.tick(250 + 10);
  assert.ok(left.reason instanceof HttpError && left.reason.status === 504, String(left.reason));
  assert.ok(clock.now() - at <= 250 + 10);
  assert.equal(hangUps.size, 0);
  // Nothing pending and no forwards starting: the timer stops.
  clock.tick(1000);
  assert.equal(clock.pendingTimers, 0);
  // A lone forward after that is checked every tick: its 504 comes within a tick of its bound.
  const from = delays.length;
  const lone = hangUps.watch(staying(), target, 30, clock.now());
  hangUps.bodySent(lone, clock.now());
  clock.tick(25);
  assert.equal(lone.aborted, false, "not before its bound");
  clock.tick(15);
  assert.ok(lone.reason instanceof HttpError && lone.reason.status === 504, String(lone.reason));
  assert.deepEqual(delays.slice(from), [10, 10, 10], "a tick at a time while it waited");
  assert.equal(clock.pendingTimers, 0);
});
