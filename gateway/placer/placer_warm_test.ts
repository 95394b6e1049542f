import assert from "node:assert/strict";
import { Fleet } from "../fleet/fleet.ts";
import {
  pickTwoChoices,
  placementAsk,
  placementFilters,
  Placer,
  seededRandom,
  type WarmCandidate,
} from "./placer.ts";
import { FakeClock } from "../../shared/clock.ts";
import { checkIn, reading } from "../_fixtures_test.ts";
import type { CheckIn } from "../../shared/schemas.ts";

/** A random source that answers the given numbers in turn. */
function scripted(...values: number[]): () => number {
  let i = 0;
  return () => values[i++ % values.length];
}

Deno.test("pickTwoChoices() samples by warm and keeps the less loaded (table)", () => {
  const a: WarmCandidate = { nodeId: "a", warm: 1, score: 1 };
  const b: WarmCandidate = { nodeId: "b", warm: 3, score: 2 };
  const c: WarmCandidate = { nodeId: "c", warm: 4, score: 0.5 };
  const cases: {
    label: string;
    candidates: WarmCandidate[];
    random: number[];
    sampled: number[];
    chosen: number;
    why: RegExp;
  }[] = [
    {
      label: "one candidate",
      candidates: [b],
      random: [0.9],
      sampled: [0],
      chosen: 0,
      why: /only/,
    },
    // total warm 8: 0.05·8 = 0.4 falls in a (warm 1); then over b+c (7): 0.9·7 = 6.3 falls in c.
    {
      label: "a then c: c less loaded",
      candidates: [a, b, c],
      random: [0.05, 0.9],
      sampled: [0, 2],
      chosen: 2,
      why: /lower load/,
    },
    // 0.3·8 = 2.4 falls in b (1..4); over a+c (5): 0.1·5 = 0.5 falls in a: a less loaded.
    {
      label: "b then a: a less loaded",
      candidates: [a, b, c],
      random: [0.3, 0.1],
      sampled: [1, 0],
      chosen: 0,
      why: /lower load/,
    },
    {
      label: "same score: more warm wins",
      candidates: [{ nodeId: "x", warm: 1, score: 1 }, { nodeId: "y", warm: 5, score: 1 }],
      random: [0.0, 0.5],
      sampled: [0, 1],
      chosen: 1,
      why: /more warm/,
    },
    {
      label: "a full tie keeps the first sampled",
      candidates: [{ nodeId: "x", warm: 2, score: 1 }, { nodeId: "y", warm: 2, score: 1 }],
      random: [0.9, 0.2],
      sampled: [1, 0],
      chosen: 1,
      why: /first sampled/,
    },
  ];
  for (const t of cases) {
    const r = pickTwoChoices(t.candidates, scripted(...t.random));
    assert.deepEqual(r.sampled, t.sampled, t.label);
    assert.equal(r.chosen, t.chosen, t.label);
    assert.match(r.why, t.why, t.label);
  }
});

Deno.test("seededRandom() replays: one seed, one sequence of picks", () => {
  const candidates = [1, 2, 3, 4, 5].map((i) => ({ nodeId: `n${i}`, warm: i, score: i % 3 }));
  const run = (seed: number) => {
    const random = seededRandom(seed);
    return Array.from({ length: 50 }, () => pickTwoChoices(candidates, random).chosen);
  };
  assert.deepEqual(run(42), run(42));
  assert.notDeepEqual(run(42), run(43));
});

Deno.test("The template and volume filters name what a node lacks (table)", () => {
  const template = placementFilters.find((f) => f.reason === "template")!;
  const volume = placementFilters.find((f) => f.reason === "volume")!;
  const node = (templates: string[] | null, volumes: string[]) => ({
    id: "n",
    endpoint: "http://10.0.0.1:3676",
    intervalSeconds: 15,
    build: "t",
    firstSeen: 0,
    lastCheckIn: 0,
    heardSinceStart: true,
    reading: reading(),
    readingSeq: 1,
    pools: [],
    templates,
    volumes,
    egressRules: false,
    configDigest: null,
  });
  const limits = { cpuLimitPct: 70, activeLimit: 400, minDiskBytes: 0 };
  const cases: [string, string[] | null, string[], ReturnType<typeof placementAsk>, string?][] = [
    ["holds it", ["base", "gpu"], [], placementAsk("gpu"), undefined],
    ["lacks it", ["base"], [], placementAsk("gpu"), "lacks template 'gpu'"],
    ["does not say: passes", null, [], placementAsk("gpu"), undefined],
    ["no template asked: base", ["minimal"], [], placementAsk(undefined), "lacks template 'base'"],
  ];
  for (const [label, templates, volumes, ask, expected] of cases) {
    const input = { node: node(templates, volumes), now: 0, inFlight: 0, limits, down: false, ask };
    assert.equal(template.check(input), expected, label);
  }
  const volumeCases: [string, string[], string[], string?][] = [
    ["has both", ["data", "cache"], ["data", "cache"], undefined],
    ["lacks one", ["data"], ["data", "cache"], "lacks volume 'cache'"],
    ["none asked", [], [], undefined],
  ];
  for (const [label, volumes, asked, expected] of volumeCases) {
    const ask = placementAsk("base", { volumes: asked.map((name) => ({ name, mountPath: "/m" })) });
    const input = { node: node(null, volumes), now: 0, inFlight: 0, limits, down: false, ask };
    assert.equal(volume.check(input), expected, label);
  }
  // Volumes make a create unclaimable: a warm sandbox has none mounted.
  assert.equal(
    placementAsk("base", { volumes: [{ name: "d", mountPath: "/d" }] }).poolKey,
    undefined,
  );
  assert.equal(placementAsk("base", { network: true }).poolKey, undefined);
  assert.equal(placementAsk("base", { cpus: 2, env: { A: "1" } }).poolKey, "base/2/-");
});

function fleetOf(bodies: CheckIn[], clock = new FakeClock()) {
  const fleet = new Fleet({ clock });
  for (const b of bodies) fleet.checkIn(b);
  return fleet;
}

const pool = (warm: number, template = "base") => ({ template, spec: {}, warm, target: warm });

Deno.test("Placer.pick() prefers warm holders, explains the two sampled, else least loaded", () => {
  const fleet = fleetOf([
    checkIn("idle", "http://10.0.0.1:3676", { reading: reading({ active: 0 }) }),
    checkIn("warm-a", "http://10.0.0.2:3676", {
      reading: reading({ active: 8 }),
      pools: [pool(2)],
    }),
    checkIn("warm-b", "http://10.0.0.3:3676", {
      reading: reading({ active: 4 }),
      pools: [pool(2)],
    }),
  ]);
  const placer = new Placer({ fleet, random: scripted(0.1, 0.9) });
  const r = placer.pick(placementAsk("base"));
  assert.ok(r.ok);
  assert.equal(r.node.id, "warm-b");
  assert.deepEqual(r.explain.warm?.sampled.map((s) => s.nodeId), ["warm-a", "warm-b"]);
  assert.match(r.explain.warm!.why, /lower load score/);
  assert.equal(r.explain.scores[0].nodeId, "idle", "the load score alone would pick idle");
  // Another template has no warm anywhere: least loaded, no warm explain.
  const cold = placer.pick(placementAsk("minimal"));
  assert.ok(cold.ok);
  assert.equal(cold.node.id, "idle");
  assert.equal(cold.explain.warm, undefined);
  fleet.close();
});

Deno.test("Placer.pick() of two gateways over the same warm holders spreads their claims, not herds", () => {
  // Four holders alike (score, warm): each pick is its first sample, uniform over the four.
  const fleet = fleetOf(
    ["a", "b", "c", "d"].map((id, i) =>
      checkIn(id, `http://10.0.0.${i + 1}:3676`, { pools: [pool(8)] })
    ),
  );
  const ask = placementAsk("base");
  const chosen = (placer: Placer) => placer.pick(ask).explain.warm!.chosen;
  /** Of 64 moments at which both gateways place a claim, how many send both to one node. */
  const together = (x: Placer, y: Placer) => {
    let same = 0;
    for (let i = 0; i < 64; i++) if (chosen(x) === chosen(y)) same++;
    return same;
  };
  // Independent picks among four meet about a quarter of the time (16 of 64; 40 or more has a
  // chance near 1e-11); one shared sequence meets every time.
  const herd = 40;
  // As the gateway builds its placer (gateway/app.ts): no seed given, so each draws its own.
  const g1 = new Placer({ fleet }), g2 = new Placer({ fleet });
  assert.notEqual(g1.seed, g2.seed, "two gateways drew one seed");
  const met = together(g1, g2);
  assert.ok(met < herd, `default seeds: the two gateways sent ${met} of 64 claims to one node`);
  // Given seeds (a replay): any two distinct ones spread too.
  const replay = together(new Placer({ fleet, seed: 1 }), new Placer({ fleet, seed: 2 }));
  assert.ok(replay < herd, `seeds 1 and 2: ${replay} of 64 claims to one node`);
  // And one gateway alone reaches every holder.
  assert.equal(new Set(Array.from({ length: 64 }, () => chosen(g1))).size, 4);
  fleet.close();
});

Deno.test("Placer.place() counts claims against the warm count until the next reading", () => {
  const body = checkIn("w", "http://10.0.0.2:3676", { pools: [pool(2)] });
  const fleet = fleetOf([checkIn("c", "http://10.0.0.1:3676"), body]);
  const placer = new Placer({ fleet, seed: 1 });
  const ask = placementAsk("base");
  const picks = ["s1", "s2", "s3"].map((name) => placer.place(name, ask));
  assert.deepEqual(picks.map((p) => p.ok && p.node.id), ["w", "w", "c"]);
  assert.ok(picks[2].ok && picks[2].explain.warm === undefined, "w's two warm are spoken for");
  // A destroy within the interval gives the claim back.
  placer.release("s2");
  const again = placer.place("s4", ask);
  assert.ok(again.ok && again.node.id === "w");
  // The node's next reading says what is warm now; claims restart from it.
  fleet.checkIn(body);
  assert.ok(placer.pick(ask).ok && placer.pick(ask).explain.warm?.chosen === "w");
  fleet.close();
});

Deno.test("Placer.pick() names a template no node has; only-down holders is not that", () => {
  const clock = new FakeClock();
  const fleet = fleetOf([
    checkIn("a", "http://10.0.0.1:3676", { templates: ["base", "minimal"] }),
    checkIn("b", "http://10.0.0.2:3676", { templates: ["base", "gpu"] }),
  ], clock);
  const placer = new Placer({ fleet });
  const nowhere = placer.pick(placementAsk("cuda"));
  assert.ok(!nowhere.ok);
  assert.deepEqual(nowhere.templateNowhere, {
    template: "cuda",
    offered: ["base", "gpu", "minimal"],
  });
  assert.equal(nowhere.explain.rejected.template, 2);
  const onB = placer.pick(placementAsk("gpu"));
  assert.ok(onB.ok && onB.node.id === "b");
  assert.deepEqual(onB.explain.rejections, [
    { nodeId: "a", reason: "template", detail: "lacks template 'gpu'" },
  ]);
  clock.tick(60_000);
  fleet.checkIn(checkIn("a", "http://10.0.0.1:3676", { templates: ["base", "minimal"] }));
  const downOnly = placer.pick(placementAsk("gpu"));
  assert.ok(!downOnly.ok);
  assert.equal(downOnly.templateNowhere, undefined, "b has it: a 503, not a 400");
  fleet.close();
});
