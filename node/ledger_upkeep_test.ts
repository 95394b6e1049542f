import assert from "node:assert/strict";
import type { Log } from "../shared/log.ts";
import type { Ledger } from "./ledger.ts";
import { LedgerFullError } from "./ledger_space.ts";
import { LedgerUpkeep } from "./ledger_upkeep.ts";

/** A ledger whose flush and reserve the test steers. */
function steered() {
  const state = { flushFails: true, reserve: false, flushes: 0 };
  const ledger = {
    unflushedTouches: 2,
    flushTouches() {
      state.flushes++;
      if (state.flushFails) throw new LedgerFullError("/data", "the idle clock of its sandboxes");
      return 2;
    },
    restoreReserve: () => state.reserve,
  } as unknown as Ledger;
  const lines: string[] = [];
  const log: Log = (level, msg) => lines.push(`${level} ${msg}`);
  return { state, ledger, log, lines };
}

Deno.test("LedgerUpkeep logs a failing flush and a missing reserve once each, and their recovery once", () => {
  const { state, ledger, log, lines } = steered();
  const upkeep = new LedgerUpkeep({ ledger, log });
  for (let i = 0; i < 3; i++) upkeep.tick();
  state.flushFails = false;
  state.reserve = true;
  upkeep.tick();
  upkeep.tick();
  assert.equal(state.flushes, 5, "every tick tries again");
  assert.deepEqual(lines, [
    "warn could not write the idle clock to the ledger; it stays in memory until a flush works",
    "warn the data disk has no room for the ledger's reserve: new sandboxes are refused (507) until it has",
    "info the idle clock is written again",
    "info the ledger's reserve is back: new sandboxes are accepted again",
  ]);
});

Deno.test("LedgerUpkeep.stop() flushes a last time and stops the timer", async () => {
  const { state, ledger, log } = steered();
  state.flushFails = false;
  const upkeep = new LedgerUpkeep({ ledger, log, intervalMs: 60_000 });
  upkeep.start();
  assert.equal(state.flushes, 1);
  await upkeep.stop();
  assert.equal(state.flushes, 2);
});
