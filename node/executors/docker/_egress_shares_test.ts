import assert from "node:assert/strict";
import { ConnectionShares } from "./_egress_shares.ts";

Deno.test("ConnectionShares: a sandbox holding the whole node cannot keep a newcomer from its share", () => {
  const shares = new ConnectionShares<string>(8, 8);
  const closed: string[] = [];
  const evict = (x: string) => closed.push(x);
  // One sandbox (one tenant's, or idle connections held on purpose) fills the node.
  for (let i = 0; i < 8; i++) assert.equal(shares.admit("hog", `hog${i}`, evict), true);
  assert.equal(shares.admit("hog", "hog8", evict), false, "the node is full for the hog itself");
  // A newcomer gets up to an even share (8 over 2 sources), each one closing the hog's oldest.
  for (let i = 0; i < 4; i++) assert.equal(shares.admit("new", `new${i}`, evict), true);
  assert.deepEqual(closed, ["hog0", "hog1", "hog2", "hog3"]);
  assert.equal(shares.admit("new", "new4", evict), false, "past its share, while full");
  // A third gets 8 over 3 = 2, taken from whoever holds the most.
  assert.equal(shares.admit("third", "t0", evict), true);
  assert.equal(shares.admit("third", "t1", evict), true);
  assert.equal(shares.admit("third", "t2", evict), false);
  assert.equal(shares.total, 8, "never more than the node's cap");
  assert.deepEqual(closed.slice(4), ["hog4", "new0"]);
  // A released one frees room for anyone; releasing an evicted one changes nothing.
  shares.release("hog", "hog0");
  assert.equal(shares.total, 8);
  shares.release("new", "new1");
  assert.equal(shares.total, 7);
  assert.equal(shares.admit("hog", "hog9", evict), true);
  assert.equal(closed.length, 6, "room was free: nobody closed");
});

Deno.test("ConnectionShares: at most perSource of one source, even with room left", () => {
  const shares = new ConnectionShares<number>(100, 3);
  for (let i = 0; i < 3; i++) assert.equal(shares.admit("a", i, () => {}), true);
  assert.equal(shares.admit("a", 3, () => {}), false);
  assert.equal(shares.admit("b", 0, () => {}), true);
});

Deno.test("ConnectionShares: one team's many sandboxes filling the node cannot keep another team out", () => {
  const team = (source: string) => source.split("-")[0];
  const shares = new ConnectionShares<string>(8, 2, team);
  const closed: string[] = [];
  const evict = (x: string) => closed.push(x);
  // Team A starts as many sandboxes as the node holds connections, and they fill it.
  for (let i = 0; i < 8; i++) assert.equal(shares.admit(`A-${i}`, `a${i}`, evict), true);
  assert.equal(shares.total, 8, "the node is full, all of it team A's");
  assert.equal(shares.admit("A-8", "a8", evict), false, "another sandbox gains team A no room");
  assert.equal(shares.admit("A-0", "a0'", evict), false, "nor does one below its own cap");
  // Team B's sandbox opens connections up to its cap, each closing team A's oldest.
  assert.equal(shares.admit("B-0", "b0", evict), true, "team B's first connection is refused");
  assert.equal(shares.admit("B-0", "b1", evict), true);
  assert.equal(shares.admit("B-0", "b2", evict), false, "past the sandbox's cap");
  // Its teammates take team B up to an even share of the node (8 over 2 teams), no further.
  assert.equal(shares.admit("B-1", "c0", evict), true);
  assert.equal(shares.admit("B-1", "c1", evict), true);
  assert.equal(shares.admit("B-2", "e0", evict), true, "a split of team B's own share");
  assert.deepEqual([shares.heldBy("A"), shares.heldBy("B"), shares.total], [4, 4, 8]);
  assert.deepEqual(closed, ["a0", "a1", "a2", "a3", "b0"]);
  // A third team gets 8 over 3 = 2, from the team holding the most.
  assert.equal(shares.admit("C-0", "d0", evict), true);
  assert.equal(shares.admit("C-0", "d1", evict), true);
  assert.equal(shares.admit("C-0", "d2", evict), false, "past team C's share, while full");
  assert.deepEqual([shares.heldBy("A"), shares.heldBy("B"), shares.heldBy("C")], [3, 3, 2]);
  assert.deepEqual(closed.slice(5), ["a4", "c0"], "the biggest team's biggest sandbox's oldest");
  // A teammate splits team C's share rather than taking more.
  assert.equal(shares.admit("C-1", "f0", evict), true);
  assert.equal(shares.admit("C-1", "f1", evict), false);
  assert.deepEqual([shares.heldBy("C"), closed.at(-1)], [2, "d0"]);
  // A team gone leaves no entry behind to shrink the others' shares.
  shares.release("C-0", "d1");
  shares.release("C-1", "f0");
  assert.equal(shares.heldBy("C"), 0);
  assert.equal(shares.admit("A-8", "a8", evict), true, "room was free");
  assert.equal(closed.length, 8, "room was free: nobody closed");
});
