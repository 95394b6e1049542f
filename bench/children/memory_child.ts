/**
 * One memory measurement in a fresh process (RSS is process-wide, so each figure needs its own).
 * Modes: `bare` (nothing loaded), `map` (a plain Map of 100,000 name → {id, name}), `finder`
 * (the gateway's modules and a Finder whose cache gets 100,000 sandboxes). Prints one JSON line.
 *
 * Usage: deno run --v8-flags=--expose-gc --allow-read bench/children/memory_child.ts finder 100000
 *
 * @module
 */
const mode = Deno.args[0] ?? "bare";
const entries = Number(Deno.args[1] ?? "100000");
const gc = (globalThis as { gc?: () => void }).gc ?? (() => {});

function settle(): number {
  for (let i = 0; i < 4; i++) gc();
  return Deno.memoryUsage().rss;
}

function sandboxAt(i: number): { id: string; name: string; state: string } {
  // Names like an agent platform's, ids as long as a UUID: realistic key sizes.
  return { id: crypto.randomUUID(), name: `agent-${String(i).padStart(6, "0")}`, state: "active" };
}

const keep: unknown[] = [];
if (mode === "bare") {
  console.log(JSON.stringify({ idle: settle(), full: settle() }));
} else if (mode === "map") {
  const idle = settle();
  const map = new Map<string, { id: string; name: string; state: string }>();
  for (let i = 0; i < entries; i++) {
    const s = sandboxAt(i);
    map.set(s.name, s);
  }
  keep.push(map);
  console.log(JSON.stringify({ idle, full: settle(), size: map.size }));
} else {
  const { Fleet, Finder, Placer, NameQueue } = await import("../../gateway/mod.ts");
  const { checkIn, benchToken } = await import("../lib/fixtures.ts");
  const fleet = new Fleet();
  for (let i = 0; i < 10; i++) fleet.checkIn(checkIn(i, `http://127.0.0.1:${40000 + i}`));
  const finder = new Finder({ fleet, token: benchToken });
  keep.push(new Placer({ fleet }), new NameQueue());
  const idle = settle();
  const nodes = [...fleet.nodes()];
  for (let i = 0; i < entries; i++) finder.remember(nodes[i % nodes.length], sandboxAt(i));
  keep.push(finder);
  const full = settle();
  console.log(JSON.stringify({ idle, full, size: finder.cacheSize }));
}
