/**
 * The Finder tests' fleet: a fake fetch whose nodes answer lookups as each test scripts them,
 * timers the test fires itself, and a Finder over up to three such nodes.
 *
 * @module
 */
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder, type FinderTimers } from "./finder.ts";
import { FakeClock } from "../../shared/clock.ts";
import { checkIn, recordingLog } from "../_fixtures_test.ts";

export const TOKEN = "t".repeat(32);

export type Behaviour =
  | { found: { id: string; name: string; state?: string } }
  | "absent"
  | "refused"
  | "hang"
  | { status: number };

export interface Call {
  url: string;
  body: Record<string, string>;
  authorization: string | null;
  signal: AbortSignal | undefined;
}

/** A fetch that answers `lookupSandbox` per endpoint from a table the test edits. */
export function fakeFetch(behaviours: Map<string, Behaviour>) {
  const calls: Call[] = [];
  const fn = (async (input: RequestInfo | URL, init?: RequestInit) => {
    ({ url: input, init } = await plainArgs(input, init));
    const url = String(input);
    const origin = new URL(url).origin;
    const body = JSON.parse(String(init?.body));
    const headers = new Headers(init?.headers);
    calls.push({
      url,
      body,
      authorization: headers.get("authorization"),
      signal: init?.signal ?? undefined,
    });
    const b = behaviours.get(origin) ?? "absent";
    if (b === "refused") {
      throw new TypeError("tcp connect error: Connection refused (os error 111)");
    }
    if (b === "hang") {
      return await new Promise<Response>((_, reject) => {
        const signal = init?.signal;
        if (signal?.aborted) reject(signal.reason);
        signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
      });
    }
    if (b === "absent") return Response.json({ found: false });
    if ("status" in b) return new Response("node says no", { status: b.status });
    // By id, a found sandbox is found only when the id matches.
    if (body.id !== undefined && body.id !== b.found.id) return Response.json({ found: false });
    return Response.json({ found: true, sandbox: { state: "active", ...b.found } });
  }) as typeof fetch;
  return { fn, calls };
}

/** Timers the test fires by hand, so the deadline is asserted without real time. */
export function manualTimers() {
  const pending = new Map<number, { fn: () => void; ms: number }>();
  let next = 1;
  const timers: FinderTimers = {
    setTimeout: (fn, ms) => {
      pending.set(next, { fn, ms });
      return next++;
    },
    clearTimeout: (handle) => {
      pending.delete(handle as number);
    },
  };
  return {
    timers,
    pending,
    fireAll() {
      for (const [id, t] of [...pending]) {
        pending.delete(id);
        t.fn();
      }
    },
  };
}

export const EP = {
  a: "http://10.0.0.1:3676",
  b: "http://10.0.0.2:3676",
  c: "http://10.0.0.3:3676",
};

export function setup(
  nodes: Partial<Record<keyof typeof EP, Behaviour>>,
  cacheSize?: number,
  fleetOptions: { deadAfterMs?: number } = {},
) {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock, ...fleetOptions });
  const behaviours = new Map<string, Behaviour>();
  for (const [id, b] of Object.entries(nodes)) {
    const endpoint = EP[id as keyof typeof EP];
    fleet.checkIn(checkIn(id, endpoint));
    behaviours.set(endpoint, b);
  }
  const fake = fakeFetch(behaviours);
  const t = manualTimers();
  const { log, lines } = recordingLog();
  const finder = new Finder({
    fleet,
    token: TOKEN,
    fetch: fake.fn,
    timers: t.timers,
    clock,
    log,
    cacheSize,
  });
  return { clock, fleet, behaviours, fake, t, finder, lines };
}

export const s1 = { id: "sb-1", name: "alpha" };
