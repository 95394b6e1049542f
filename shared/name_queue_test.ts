import assert from "node:assert/strict";
import { NameQueue } from "./name_queue.ts";

function deferred<T = void>() {
  let resolve!: (v: T) => void, reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

Deno.test("NameQueue.run() runs at once when the key is free", async () => {
  const q = new NameQueue();
  let ran = false;
  const p = q.run("a", () => {
    ran = true;
    return 1;
  });
  assert.equal(q.isBusy("a"), true);
  assert.equal(await p, 1);
  assert.equal(ran, true);
});

Deno.test("NameQueue.run() never overlaps tasks of one key and keeps their order", async () => {
  const q = new NameQueue();
  const gate = deferred();
  const order: string[] = [];
  let inside = 0, most = 0;
  const task = (label: string, wait?: Promise<void>) => async () => {
    inside++;
    most = Math.max(most, inside);
    order.push(`start ${label}`);
    if (wait) await wait;
    await Promise.resolve();
    order.push(`end ${label}`);
    inside--;
  };
  const all = [q.run("k", task("1", gate.promise)), q.run("k", task("2")), q.run("k", task("3"))];
  await Promise.resolve();
  assert.deepEqual(order, ["start 1"]);
  gate.resolve();
  await Promise.all(all);
  assert.equal(most, 1);
  assert.deepEqual(order, ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]);
});

Deno.test("NameQueue.run() lets other keys run while one key is held", async () => {
  const q = new NameQueue();
  const gate = deferred();
  const held = q.run("a", () => gate.promise);
  let other = false;
  await q.run("b", () => {
    other = true;
  });
  assert.equal(other, true);
  assert.equal(q.isBusy("a"), true);
  gate.resolve();
  await held;
});

Deno.test("NameQueue.run() does not let a rejected task block the next", async () => {
  const q = new NameQueue();
  const failing = q.run("k", () => Promise.reject(new Error("boom")));
  const next = q.run("k", () => "ok");
  await assert.rejects(failing, /boom/);
  assert.equal(await next, "ok");
});

Deno.test("NameQueue.run() leaves no memory behind for an idle key", async () => {
  const q = new NameQueue();
  await Promise.all([q.run("a", () => 1), q.run("a", () => 2), q.run("b", () => 3)]);
  await q.run("c", () => Promise.reject(new Error("x"))).catch(() => {});
  await Promise.resolve();
  assert.equal(q.size, 0);
  assert.equal(q.isBusy("a"), false);
  assert.equal(q.isBusy("c"), false);
});

Deno.test("NameQueue.idle() resolves after the queued work settles", async () => {
  const q = new NameQueue();
  const gate = deferred();
  let done = false;
  q.run("k", async () => {
    await gate.promise;
    done = true;
  });
  const idle = q.idle("k");
  gate.resolve();
  await idle;
  assert.equal(done, true);
  await q.idle("never-used");
});
