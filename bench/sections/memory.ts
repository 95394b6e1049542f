/**
 * Benchmark 6, memory: the gateway's RSS idle and with 100,000 sandboxes in the Finder's cache,
 * each measured in a fresh child process after a forced GC.
 *
 * References, measured in the same run: a bare Deno process (for the idle figure) and a plain
 * `Map` holding the same 100,000 sandboxes (for the added figure: the least any cache of these
 * keys costs).
 *
 * @module
 */
import { median, type Row, row, type Section } from "../lib/stats.ts";

interface Measure {
  idle: number;
  full: number;
}

async function measure(mode: string, entries: number): Promise<Measure> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--v8-flags=--expose-gc",
      "--allow-read",
      "--allow-env",
      new URL("../children/memory_child.ts", import.meta.url).pathname,
      mode,
      String(entries),
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `Memory child '${mode}' failed: ${new TextDecoder().decode(out.stderr).slice(-1000)}`,
    );
  }
  return JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
}

/** Options of the memory benchmark. */
export interface MemoryOptions {
  /** Runs (at least five). */
  runs: number;
  /** Sandboxes to cache (100,000, the cache's bound). */
  entries?: number;
}

/** Runs the memory benchmark. */
export async function runMemory(options: MemoryOptions): Promise<Section> {
  const { runs, entries = 100_000 } = options;
  const MB = 1024 * 1024;
  const bare: number[] = [], idle: number[] = [], added: number[] = [], mapAdded: number[] = [];
  for (let r = 0; r < runs; r++) {
    const b = await measure("bare", entries);
    const m = await measure("map", entries);
    const f = await measure("finder", entries);
    bare.push(b.idle / MB);
    mapAdded.push((m.full - m.idle) / MB);
    idle.push(f.idle / MB);
    added.push((f.full - f.idle) / MB);
  }
  const rows: Row[] = [
    row("bare Deno process RSS (reference for idle)", "MB", bare, bare),
    row("gateway idle RSS (Fleet, Finder, Placer, NameQueue)", "MB", idle, bare),
    row(
      `plain Map of the same ${
        entries.toLocaleString("en-US")
      } sandboxes, added (reference for added)`,
      "MB",
      mapAdded,
      mapAdded,
    ),
    row(
      `Finder cache with ${entries.toLocaleString("en-US")} sandboxes, added`,
      "MB",
      added,
      mapAdded,
      {
        target: "≤ 50 MB",
        met: median(added) <= 50,
      },
    ),
  ];
  return {
    title: "Memory: gateway RSS",
    reference: "a bare Deno process (idle rows) and a plain Map of the same sandboxes (added rows)",
    rows,
    notes: [
      `Each figure is a fresh child process after four forced GCs (--expose-gc). The Finder ` +
      `keeps two indexes (by name and by id), so ${entries.toLocaleString("en-US")} sandboxes ` +
      `are ${(2 * entries).toLocaleString("en-US")} cache entries; names are 12 characters, ` +
      `ids 36 (UUID). Per sandbox: ${(median(added) * MB / entries).toFixed(0)} bytes.`,
    ],
  };
}
