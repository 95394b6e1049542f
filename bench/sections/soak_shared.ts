/**
 * The shared-mode soak: two gateways on one local etcd (three members), two nodes on the fake
 * executor checking in with both, and clients running for a set time (5 minutes by default,
 * 20 s with `--quick`) against the two promises several gateways must keep:
 *
 * - **No stale 404.** Movers destroy names and make them again through gateway 1, each time on
 *   the other node (node 0 holds template `t0`, node 1 `t1`, and each generation asks for the
 *   other one), while exec clients run commands on the same names through gateway 2, whose
 *   cached entry then names the old node. Every 404 an exec meets while its name exists (made
 *   before the exec was sent, not yet being destroyed when its answer came) is a stale 404: the
 *   target is none.
 * - **No team over its limit.** A key with `maxSandboxes: 3` sends bursts of eight concurrent
 *   creates (native acquires and E2B creates, alternating over the two gateways), then kills some
 *   of what it built. Every second the team's running count is read through both gateways'
 *   `listSandboxes` and E2B list, and from the nodes themselves: it must never exceed 3. Kills
 *   and these readings take turns (a listing asks the two nodes one after the other, so one
 *   straddling a kill and the next create could count a sandbox already gone).
 *
 * Reported: requests, stale 404s, the team's most running, 503s by cause, the p50/p99 of the
 * execs through gateway 2 against execs sent straight to a node in the same run, and each
 * gateway's RSS at the start and the end.
 *
 * Run alone: `deno run --allow-net=127.0.0.1 --allow-read --allow-write --allow-run
 * --allow-env=PATH --allow-sys=loadavg bench/sections/soak_shared.ts [--quick] [--seconds=<n>]` prints the
 * section; `deno task bench --only=soak-shared [--quick]` writes it into RESULTS.md. Skipped,
 * saying why, when etcd (Debian's `etcd-server`) is not installed.
 *
 * @module
 */
import { etcdBinary, startEtcd } from "../../tests/support/etcd.ts";
import { benchToken, type Daemon, postJson, startGateway, startNode } from "../lib/fixtures.ts";
import { percentile, renderReport, type Row, row, type Section } from "../lib/stats.ts";

/** Options of the soak. */
export interface SoakOptions {
  /** How long the clients run, in ms (default 5 minutes). */
  durationMs?: number;
  /** etcd members (default 3). */
  etcdMembers?: number;
  /** Names the movers destroy and make again (default 4). */
  names?: number;
  /** Exec clients through gateway 2 (default 6). */
  execClients?: number;
  /** The key's `maxSandboxes` (default 3). */
  maxSandboxes?: number;
  /** Concurrent creates per burst (default 8). */
  burst?: number;
}

/** The soak's figures, as the section reports them and a test reads them. */
export interface SoakFigures {
  /** Seconds the clients ran. */
  seconds: number;
  /** Every request the clients and the sampler sent. */
  requests: number;
  /** Execs through gateway 2, by answer status (`error` when no answer came). */
  execStatuses: Record<string, number>;
  /** 404s on an exec whose name existed for the whole exchange. */
  stale404: number;
  /** The first few stale 404s: name, the answer's body. */
  staleSamples: string[];
  /** Generations made by the movers, and how many landed on another node than the last. */
  generations: number;
  moves: number;
  /** The team's most running sandboxes, per reader. */
  maxTeam: Record<string, number>;
  /** The key's limit. */
  maxSandboxes: number;
  /** Burst creates, by outcome (`built`, `429`, `503`, …). */
  burstOutcomes: Record<string, number>;
  /** 503s by cause (the message with names and numbers blanked), over every client. */
  unavailable: Record<string, number>;
  /** Exec latency through gateway 2 and straight to a node, ms. */
  execP50: number;
  execP99: number;
  directP50: number;
  directP99: number;
  /** Each gateway's RSS at the start (after the warm-up) and at the end, MiB. */
  rssStart: number[];
  rssEnd: number[];
  /** Each gateway's RSS, MiB, at each tenth of the run: growth that levels off is warm-up. */
  rssTrace: { second: number; mib: number[] }[];
}

const title = "Soak: two gateways on one etcd, stale caches and a team's limit";

/** The bound on one request of the soak: past it, the request counts as unanswered. */
const REQUEST_TIMEOUT_MS = 30_000;
/** Existence windows kept per name: far more than a request's lifetime covers. */
const WINDOWS_KEPT = 256;
/** Distinct 503 causes kept; past it they count under one "other" cause. */
const CAUSES_KEPT = 40;
/** Latency samples kept per series (a reservoir past it). */
const SAMPLES_KEPT = 200_000;

// deno-lint-ignore no-explicit-any
type Answer = { status: number; json: any };

/** A 503's cause: its message with quoted names and numbers blanked, so alike ones add up. */
export function causeOf(message: unknown): string {
  const text = typeof message === "string" ? message : JSON.stringify(message ?? "");
  return text.replace(/'[^']*'/g, "'…'").replace(/\d+(\.\d+)?/g, "N").slice(0, 160);
}

/** A name's existence: made at `since` (its acquire answered), destroyed from `until` on. */
interface Window {
  since: number;
  until: number;
}

/**
 * Whether an exchange from `sent` to `answered` fell wholly inside one of `windows`: the name
 * existed for all of it, so a 404 was stale.
 */
export function existedThroughout(windows: readonly Window[], sent: number, answered: number) {
  return windows.some((w) => w.since <= sent && answered <= w.until);
}

/** A fixed-size sample of a long series (Algorithm R), so memory stays bounded on any run. */
class Reservoir {
  values: number[] = [];
  #seen = 0;
  add(x: number) {
    this.#seen++;
    if (this.values.length < SAMPLES_KEPT) this.values.push(x);
    else {
      const j = Math.floor(Math.random() * this.#seen);
      if (j < SAMPLES_KEPT) this.values[j] = x;
    }
  }
}

/** Takes turns: a reading of the team and a round of kills never overlap. */
class Turns {
  #tail: Promise<void> = Promise.resolve();
  async run<T>(fn: () => Promise<T>): Promise<T> {
    const before = this.#tail;
    let release!: () => void;
    this.#tail = new Promise((r) => release = r);
    await before;
    try {
      return await fn();
    } finally {
      release();
    }
  }
}

async function rssMiB(pid: number): Promise<number> {
  const out = await new Deno.Command("cat", { args: [`/proc/${pid}/status`], stderr: "null" })
    .output();
  const m = /VmRSS:\s+(\d+) kB/.exec(new TextDecoder().decode(out.stdout));
  return m ? Number(m[1]) / 1024 : NaN;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs the soak and returns its figures; throws when the fleet cannot be set up. */
export async function soak(options: SoakOptions = {}): Promise<SoakFigures> {
  const {
    durationMs = 5 * 60_000,
    etcdMembers = 3,
    names = 4,
    execClients = 6,
    maxSandboxes = 3,
    burst = 8,
  } = options;
  let requests = 0;
  const unavailable = new Map<string, number>();
  const count503 = (a: Answer) => {
    if (a.status !== 503) return;
    let cause = causeOf(a.json?.message ?? a.json);
    if (!unavailable.has(cause) && unavailable.size >= CAUSES_KEPT) cause = "other";
    unavailable.set(cause, (unavailable.get(cause) ?? 0) + 1);
  };
  /** One request; `error` answers (status 0) when none came within the bound. */
  const send = async (
    url: string,
    init: { method?: string; auth?: Record<string, string>; body?: unknown } = {},
  ): Promise<Answer> => {
    requests++;
    try {
      const res = await fetch(url, {
        method: init.method ?? "POST",
        headers: {
          ...(init.auth ?? { authorization: `Bearer ${benchToken}` }),
          ...(init.body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: init.body === undefined ? undefined : JSON.stringify(init.body),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const text = await res.text();
      let json: unknown = text;
      try {
        json = text ? JSON.parse(text) : null;
      } catch { /* not JSON */ }
      const a = { status: res.status, json };
      count503(a);
      return a;
    } catch (error) {
      return { status: 0, json: { message: (error as Error).message } };
    }
  };

  const etcd = await startEtcd(etcdMembers);
  const started: Daemon[] = [];
  try {
    const env = {
      DORMICE_GATEWAY_ETCD: etcd.endpoints,
      DORMICE_GATEWAY_ETCD_PREFIX: `/soak-${crypto.randomUUID().slice(0, 8)}/`,
      // The nodes share this machine's cores with etcd, the gateways and the clients: their CPU
      // reading is the machine's, and must not decide what the soak is about.
      DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
    };
    const gateways = await Promise.all([startGateway([], env), startGateway([], env)]);
    started.push(...gateways);
    const [g1, g2] = gateways;
    const nodes = await Promise.all(
      [0, 1].map((i) =>
        startNode(`soak-node-${i}`, gateways.map((g) => g.url).join(","), [], {
          DORMICE_TEMPLATES: `base=dormice-base:latest,t${i}=dormice-minimal:latest`,
        })
      ),
    );
    started.push(...nodes);
    for (const gw of gateways) {
      const deadline = Date.now() + 30_000;
      for (;;) {
        const { json } = await postJson(`${gw.url}/listNodes`, {});
        // deno-lint-ignore no-explicit-any
        const up = (json?.nodes ?? []).filter((n: any) =>
          n.state === "up" && n.reading !== null && n.templates !== null
        );
        if (up.length === 2) break;
        if (Date.now() > deadline) {
          throw new Error(`${gw.url} did not see both nodes up: ${JSON.stringify(json)}`);
        }
        await sleep(100);
      }
    }

    // The key with the limit, known to both gateways before the clients start.
    const team = "soak-limit";
    const minted = await postJson(`${g1.url}/createApiKey`, { team, maxSandboxes });
    if (minted.status !== 200) throw new Error(`createApiKey: ${JSON.stringify(minted.json)}`);
    const key: string = minted.json.key;
    const keyAuth = { authorization: `Bearer ${key}` };
    const e2bAuth = { "x-api-key": key };
    for (const gw of gateways) {
      const deadline = Date.now() + 15_000;
      while ((await send(`${gw.url}/listSandboxes`, { auth: keyAuth, body: {} })).status !== 200) {
        if (Date.now() > deadline) throw new Error(`${gw.url} did not learn the soak's key`);
        await sleep(100);
      }
    }

    // The reference: a name on node 0 that never moves, exec'd straight at its node.
    const ref = await send(`${g1.url}/acquireSandbox`, { body: { name: "ref", template: "t0" } });
    if (ref.status !== 200) throw new Error(`acquire ref: ${JSON.stringify(ref.json)}`);
    const refNode = nodes[0].url;

    const rssStart = await Promise.all(gateways.map((g) => rssMiB(g.pid)));
    const t0 = performance.now();
    const end = t0 + durationMs;
    const running = () => performance.now() < end;

    // (a) Movers through gateway 1, execs through gateway 2.
    const windows = new Map<string, Window[]>();
    const nameList = Array.from({ length: names }, (_, i) => `moving-${i}`);
    let generations = 0, moves = 0;
    const mover = async (name: string, offset: number) => {
      let gen = offset, lastNode: string | undefined;
      const list: Window[] = [];
      windows.set(name, list);
      while (running()) {
        const template = `t${gen++ % 2}`;
        const made = await send(`${g1.url}/acquireSandbox`, { body: { name, template } });
        if (made.status === 200) {
          const w = { since: performance.now(), until: Infinity };
          list.push(w);
          if (list.length > WINDOWS_KEPT) list.shift();
          generations++;
          const nodeId = made.json?.sandbox?.nodeId;
          if (lastNode !== undefined && nodeId !== lastNode) moves++;
          lastNode = nodeId;
          await sleep(200 + Math.random() * 600);
          w.until = performance.now();
        } else {
          await sleep(100);
        }
        // Destroyed whatever the acquire said: a 5xx may have built it.
        await send(`${g1.url}/destroySandbox`, { body: { name } });
      }
    };
    const execStatuses = new Map<string, number>();
    const staleSamples: string[] = [];
    let stale404 = 0;
    const viaGateway = new Reservoir(), direct = new Reservoir();
    const execer = async (i: number) => {
      let n = i;
      while (running()) {
        const name = nameList[n++ % nameList.length];
        const sent = performance.now();
        const a = await send(`${g2.url}/execCommand`, { body: { name, command: "echo soak" } });
        const answered = performance.now();
        const status = a.status === 0 ? "error" : String(a.status);
        execStatuses.set(status, (execStatuses.get(status) ?? 0) + 1);
        if (a.status === 200) viaGateway.add(answered - sent);
        if (a.status === 404 && existedThroughout(windows.get(name) ?? [], sent, answered)) {
          stale404++;
          if (staleSamples.length < 5) staleSamples.push(`${name}: ${JSON.stringify(a.json)}`);
        }
      }
    };
    const reference = async () => {
      while (running()) {
        const sent = performance.now();
        const a = await send(`${refNode}/execCommand`, {
          body: { name: "ref", command: "echo soak" },
        });
        if (a.status === 200) direct.add(performance.now() - sent);
        // About one exec client's pace, so the reference is a sample, not a second load.
        await sleep(20);
      }
    };

    // (b) Bursts against the key's limit; kills and readings take turns.
    const turns = new Turns();
    const burstOutcomes = new Map<string, number>();
    const maxTeam = new Map<string, number>();
    const seen = (reader: string, n: number) => {
      if (n > (maxTeam.get(reader) ?? -1)) maxTeam.set(reader, n);
    };
    type Built = { kill: () => Promise<Answer> };
    const built: Built[] = [];
    let round = 0;
    const burster = async () => {
      while (running()) {
        const r = round++;
        const answers = await Promise.all(Array.from({ length: burst }, async (_, i) => {
          const gw = gateways[(r + i) % 2];
          const other = gateways[(r + i + 1) % 2];
          if (i % 2 === 0) {
            const a = await send(`${gw.url}/e2b/api/sandboxes`, {
              auth: e2bAuth,
              body: { templateID: "base" },
            });
            const id = a.json?.sandboxID;
            const kill = () =>
              send(`${other.url}/e2b/api/sandboxes/${encodeURIComponent(id)}`, {
                method: "DELETE",
                auth: e2bAuth,
              });
            return { a, made: a.status === 201 && typeof id === "string", kill };
          }
          const name = `burst-${r}-${i}`;
          const a = await send(`${gw.url}/acquireSandbox`, { auth: keyAuth, body: { name } });
          const kill = () => send(`${other.url}/destroySandbox`, { auth: keyAuth, body: { name } });
          return { a, made: a.status === 200, kill };
        }));
        for (const { a, made, kill } of answers) {
          const outcome = made ? "built" : a.status === 0 ? "error" : String(a.status);
          burstOutcomes.set(outcome, (burstOutcomes.get(outcome) ?? 0) + 1);
          if (made) built.push({ kill });
          // A create that failed on a 5xx or no answer may have built: the readings count it.
        }
        // Killed in turn with the readings: some of what is running, so the next burst finds
        // the team anywhere from empty to full.
        await turns.run(async () => {
          const k = Math.floor(Math.random() * (built.length + 1));
          const victims = built.splice(0, k);
          await Promise.all(victims.map((v) => v.kill()));
        });
        await sleep(100);
      }
      await turns.run(async () => {
        await Promise.all(built.splice(0).map((v) => v.kill()));
      });
    };
    const teamOnNodes = async () => {
      let n = 0;
      for (const node of nodes) {
        const a = await send(`${node.url}/listSandboxes`, { body: {} });
        const rows: { team?: string }[] = a.json?.sandboxes ?? [];
        for (const s of rows) if (s.team === team) n++;
      }
      return n;
    };
    const sampler = async () => {
      while (running()) {
        await turns.run(async () => {
          const [n1, n2, e1, e2, onNodes] = await Promise.all([
            send(`${g1.url}/listSandboxes`, { auth: keyAuth, body: {} }),
            send(`${g2.url}/listSandboxes`, { auth: keyAuth, body: {} }),
            send(`${g1.url}/e2b/api/sandboxes`, { method: "GET", auth: e2bAuth }),
            send(`${g2.url}/e2b/api/sandboxes`, { method: "GET", auth: e2bAuth }),
            teamOnNodes(),
          ]);
          const rows = (x: unknown) => Array.isArray(x) ? x as { state?: string }[] : [];
          const active = (a: Answer) =>
            rows(a.json?.sandboxes).filter((s) => s.state === "active").length;
          const e2bRunning = (a: Answer) =>
            rows(a.json).filter((s) => s.state === "running").length;
          if (n1.status === 200) seen("listSandboxes through gateway 1", active(n1));
          if (n2.status === 200) seen("listSandboxes through gateway 2", active(n2));
          if (e1.status === 200) seen("E2B list through gateway 1", e2bRunning(e1));
          if (e2.status === 200) seen("E2B list through gateway 2", e2bRunning(e2));
          seen("the nodes' own listings", onNodes);
        });
        await sleep(1000);
      }
    };

    const rssTrace: { second: number; mib: number[] }[] = [];
    const tracer = async () => {
      for (let tenth = 1; tenth < 10; tenth++) {
        await sleep(Math.max(0, t0 + (durationMs * tenth) / 10 - performance.now()));
        const mib = await Promise.all(gateways.map((g) => rssMiB(g.pid)));
        rssTrace.push({ second: Math.round((performance.now() - t0) / 1000), mib });
      }
    };

    await Promise.all([
      tracer(),
      ...nameList.map((name, i) => mover(name, i)),
      ...Array.from({ length: execClients }, (_, i) => execer(i)),
      reference(),
      burster(),
      sampler(),
    ]);
    const seconds = (performance.now() - t0) / 1000;
    const rssEnd = await Promise.all(gateways.map((g) => rssMiB(g.pid)));
    return {
      seconds,
      requests,
      execStatuses: Object.fromEntries(execStatuses),
      stale404,
      staleSamples,
      generations,
      moves,
      maxTeam: Object.fromEntries(maxTeam),
      maxSandboxes,
      burstOutcomes: Object.fromEntries(burstOutcomes),
      unavailable: Object.fromEntries(unavailable),
      execP50: percentile(viaGateway.values, 50),
      execP99: percentile(viaGateway.values, 99),
      directP50: percentile(direct.values, 50),
      directP99: percentile(direct.values, 99),
      rssStart,
      rssEnd,
      rssTrace: [...rssTrace, { second: Math.round(seconds), mib: rssEnd }],
    };
  } finally {
    await Promise.all(started.map((d) => d.stop()));
    await etcd.stop();
  }
}

const list = (r: Record<string, number>) =>
  Object.entries(r).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k}: ${v}`).join("; ") ||
  "none";

/** The soak as a section of RESULTS.md, or a skipped one naming why. */
export async function runSoakShared(options: SoakOptions = {}): Promise<Section> {
  if (etcdBinary() === null) {
    const why = "etcd is not installed (apt-get install etcd-server)";
    console.error(`bench: soak-shared skipped: ${why}`);
    return { title, reference: "", rows: [], notes: [], skipped: why };
  }
  const loadBefore = Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
  const f = await soak(options);
  const loadAfter = Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
  const maxTeam = Math.max(...Object.values(f.maxTeam));
  const execs = Object.values(f.execStatuses).reduce((a, b) => a + b, 0);
  const n503 = Object.values(f.unavailable).reduce((a, b) => a + b, 0);
  const bursts = Object.values(f.burstOutcomes).reduce((a, b) => a + b, 0);
  const rows: Row[] = [
    row("exec straight to a node, p50 (reference)", "ms", [f.directP50], [f.directP50]),
    row("exec through gateway 2 (the stale cache's side), p50", "ms", [f.execP50], [
      f.directP50,
    ]),
    row("exec straight to a node, p99 (reference for the p99)", "ms", [f.directP99], [
      f.directP99,
    ]),
    row("exec through gateway 2, p99", "ms", [f.execP99], [f.directP99]),
    row("requests, all clients", "requests", [f.requests], null, { digits: 0 }),
    row("execs through gateway 2", "requests", [execs], null, { digits: 0 }),
    // The stale case's precondition: without moves, no 404 could have been stale.
    row("names made again on the other node", "moves", [f.moves], null, {
      target: "> 0",
      met: f.moves > 0,
      digits: 0,
    }),
    row("stale 404s: an exec's name existed throughout", "answers", [f.stale404], null, {
      target: "0",
      met: f.stale404 === 0,
      digits: 0,
    }),
    row(
      `the team's most running (key maxSandboxes ${f.maxSandboxes})`,
      "sandboxes",
      [maxTeam],
      null,
      {
        target: `≤ ${f.maxSandboxes}`,
        met: maxTeam <= f.maxSandboxes,
        digits: 0,
      },
    ),
    row("503s, all clients", "answers", [n503], null, { digits: 0 }),
    ...f.rssStart.map((mib, i) =>
      row(`gateway ${i + 1} RSS at the start`, "MiB", [mib], null, { digits: 1 })
    ),
    ...f.rssEnd.map((mib, i) =>
      row(`gateway ${i + 1} RSS at the end (ratio: ÷ start)`, "MiB", [mib], [f.rssStart[i]], {
        digits: 1,
      })
    ),
  ];
  return {
    title,
    reference:
      "an exec sent straight to the node that holds its sandbox, measured by a client running through the same soak; each gateway's RSS at the end divides by its RSS at the start",
    rows,
    notes: [
      `One run of ${
        f.seconds.toFixed(0)
      } s: two gateways on a three-member etcd (one local process each, as the tests start it), two fake-executor nodes checking in with both every second. Clients: one mover per name (${f.generations} generations, ${f.moves} of them on the other node than the last) through gateway 1; exec clients through gateway 2 on the same names; a burster of ${bursts} creates with the limited key over both gateways; a reader of the team's count every second.`,
      `Exec answers through gateway 2: ${
        list(f.execStatuses)
      }. A 404 while its name was being destroyed or not yet made again is the right answer; only one inside the name's life counts as stale.`,
      `The team's most running, by reader: ${list(f.maxTeam)}.`,
      `Burst creates: ${list(f.burstOutcomes)} (built = 200/201, 429 = the key's limit).`,
      `503s by cause: ${list(f.unavailable)}.`,
      `Gateway RSS (MiB, gateway 1 / gateway 2) through the run: 0 s ${
        f.rssStart.map((m) => m.toFixed(0)).join(" / ")
      }; ${
        f.rssTrace.map((t) => `${t.second} s ${t.mib.map((m) => m.toFixed(0)).join(" / ")}`)
          .join("; ")
      }.`,
      ...(f.staleSamples.length ? [`Stale 404s seen: ${f.staleSamples.join(" | ")}`] : []),
      `Load average (1, 5, 15 min) at the section's start ${loadBefore}, at its end ${loadAfter}: both gateways, three etcd members, two nodes and the clients share this machine's cores.`,
    ],
  };
}

if (import.meta.main) {
  const quick = Deno.args.includes("--quick");
  const seconds = Deno.args.find((a) => a.startsWith("--seconds="))?.slice("--seconds=".length);
  const durationMs = seconds !== undefined ? Number(seconds) * 1000 : quick ? 20_000 : undefined;
  if (durationMs !== undefined && !(durationMs > 0)) {
    console.error(`Cannot soak for --seconds=${seconds}: give a positive number of seconds`);
    Deno.exit(2);
  }
  const section = await runSoakShared({ durationMs });
  console.log(renderReport({ date: new Date().toISOString() }, [section]));
}
