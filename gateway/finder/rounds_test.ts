import assert from "node:assert/strict";
import { SharedRounds } from "./rounds.ts";
import type { FindResult } from "./outcomes.ts";

const one = { kind: "one" } as unknown as FindResult;
const none: FindResult = { kind: "none" };

/** Rounds whose answers the test gives, in the order they started. */
function heldRounds() {
  const answers: ((r: FindResult) => void)[] = [];
  const start = () => new Promise<FindResult>((resolve) => answers.push(resolve));
  return { answers, start };
}

Deno.test("SharedRounds.join(): a caller that joined a round in flight and got none asks once more, in a round started after it came", async () => {
  const rounds = new SharedRounds();
  const { answers, start } = heldRounds();
  const starter = rounds.join("name", "x", {}, start);
  // These two came while the first round was out: the name may have been made since it began.
  const late = [rounds.join("name", "x", {}, start), rounds.join("name", "x", {}, start)];
  assert.equal(answers.length, 1, "one round for three callers");
  answers[0](none);
  assert.deepEqual(await starter, none, "the round's own starter takes its answer");
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(answers.length, 2, "the late callers share one second round");
  answers[1](one);
  for (const answer of await Promise.all(late)) assert.equal(answer, one);
});

Deno.test("SharedRounds.join(): a joiner takes a found answer as it is, and asks again only once", async () => {
  const rounds = new SharedRounds();
  const { answers, start } = heldRounds();
  rounds.join("name", "x", {}, start);
  const joined = rounds.join("name", "x", {}, start);
  answers[0](one);
  assert.equal(await joined, one);
  assert.equal(answers.length, 1, "no second round after a found answer");

  rounds.join("name", "y", {}, start);
  const late = rounds.join("name", "y", {}, start);
  answers[1](none);
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(answers.length, 3);
  answers[2](none);
  assert.deepEqual(await late, none, "the second round's none is the answer");
  assert.equal(answers.length, 3, "no third round");
});

Deno.test("SharedRounds.join(): a joiner whose client left while the first round was out asks no more", async () => {
  const rounds = new SharedRounds();
  const { answers, start } = heldRounds();
  rounds.join("name", "x", {}, start);
  const controller = new AbortController();
  const late = rounds.join("name", "x", { signal: controller.signal }, start);
  controller.abort(new Error("client left"));
  await assert.rejects(late, /client left/);
  answers[0](none);
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(answers.length, 1);
});
