/**
 * Where one request's time goes in a proxy at one connection, read from the kernel: its main
 * thread's socket calls (`raw_syscalls`) and its time on the CPU (`sched:sched_switch`), recorded
 * by `perf record -a` with filters on the proxy's process. At one connection a request's latency
 * is a chain (wrk, the proxy, the node, the proxy, wrk), and of the proxy's work only part is on
 * it: the node works on the other core while the proxy waits for its answer, so work done in that
 * wait is free, and work done anywhere else delays the answer. So each request's CPU time on the
 * proxy's main thread is split at its two sends:
 *
 * - `toNode`: from the client's answer sent to the next request sent to the node: the rest of the
 *   last request (post-answer work, which wrk's next request waits for whenever wrk shares the
 *   proxy's core, about half the time here) and the next one's reading and routing;
 * - `toClient`: from the wake-up that brings the node's answer to the client's answer sent;
 * - `waiting`: from the node's request sent to that wake-up, while the node works: off the chain.
 *
 * `toNode + toClient` is the proxy's share of the latency (an upper bound: `toNode` counts the
 * post-answer work whether wrk waited for it or not). Read for two proxies at once
 * (`bench/probes/head_to_head.ts --path`), a change that moves work into `waiting` or removes it shows
 * here where the p50s' spread hides it. Recorded with perf, every call costs a little more than
 * it would without: the figures compare proxies, they are not latencies.
 *
 * @module
 */
import { median } from "../lib/stats.ts";

/** Medians over a recording's requests, in µs of the proxy's main thread on the CPU. */
export interface PathSplit {
  /** From the client's answer sent to the node's request sent. */
  toNode: number;
  /** From the node's answer heard to the client's answer sent. */
  toClient: number;
  /** From the node's request sent to its answer heard: off the one-connection chain. */
  waiting: number;
  /** Requests the medians are of. */
  requests: number;
}

const SENDTO = 44, RECVFROM = 45, EPOLL_WAIT = 232;

/** One `perf script` line's parts: the thread, the time (µs) and what happened. */
interface Event {
  tid: number;
  at: number;
  kind: "enter" | "exit" | "switch";
  /** The call's number (enter), or the thread switched to (switch). */
  nr: number;
  /** The first argument (enter: a socket call's fd), what it returned (exit), or the thread
   * switched from (switch). */
  arg: number;
}

const LINE = /^\s*\S+\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)$/;

/** The events of `perf script`'s output, in order. */
export function parsePerfScript(text: string): Event[] {
  const events: Event[] = [];
  for (const line of text.split("\n")) {
    const m = LINE.exec(line);
    if (m === null) continue;
    const tid = Number(m[1]), at = Number(m[2]) * 1e6, name = m[3], rest = m[4];
    if (name === "raw_syscalls:sys_enter") {
      const call = /NR (\d+) \(([0-9a-f]+)/.exec(rest);
      if (call) {
        events.push({ tid, at, kind: "enter", nr: Number(call[1]), arg: parseInt(call[2], 16) });
      }
    } else if (name === "raw_syscalls:sys_exit") {
      const call = /NR (\d+) = (-?\d+)/.exec(rest);
      if (call) events.push({ tid, at, kind: "exit", nr: Number(call[1]), arg: Number(call[2]) });
    } else if (name === "sched:sched_switch") {
      const from = /prev_pid=(\d+)/.exec(rest), to = /next_pid=(\d+)/.exec(rest);
      if (from && to) {
        events.push({ tid, at, kind: "switch", nr: Number(to[1]), arg: Number(from[1]) });
      }
    }
  }
  return events;
}

/**
 * The split of `pid`'s main thread (its tid is its pid) over `events`; `nodeFds` are its sockets
 * to the node (`socketsTo`), and the client's is the other one it sends to most.
 */
export function splitPath(
  events: readonly Event[],
  pid: number,
  nodeFds: ReadonlySet<number>,
): PathSplit {
  // Its socket calls in order, each with the thread's CPU time so far.
  let on = -1;
  let cpu = 0;
  const calls: { cpu: number; nr: number; fd: number; exit: boolean; ret: number }[] = [];
  let enteredFd = -1;
  for (const e of events) {
    if (e.kind === "switch") {
      if (e.nr === pid && on < 0) on = e.at;
      if (e.arg === pid && on >= 0) {
        cpu += e.at - on;
        on = -1;
      }
      continue;
    }
    if (e.tid !== pid) continue;
    if (on < 0) on = e.at; // on the CPU, whatever the switches said
    const exit = e.kind === "exit";
    if (!exit) enteredFd = e.arg;
    calls.push({ cpu: cpu + (e.at - on), nr: e.nr, fd: enteredFd, exit, ret: exit ? e.arg : 0 });
  }
  const sends = new Map<number, number>();
  for (const c of calls) {
    if (!c.exit && c.nr === SENDTO && !nodeFds.has(c.fd)) {
      sends.set(c.fd, (sends.get(c.fd) ?? 0) + 1);
    }
  }
  const client = [...sends].sort((a, b) => b[1] - a[1])[0]?.[0];
  const toNode: number[] = [], toClient: number[] = [], waiting: number[] = [];
  // The node's answer is heard at the wake-up before the first receive of it that returns bytes;
  // a receive that finds nothing yet does not count.
  let sentClient = -1, sentNode = -1, lastWake = -1, woke = -1;
  for (const c of calls) {
    if (c.exit && c.nr === EPOLL_WAIT) lastWake = c.cpu;
    else if (!c.exit && c.nr === SENDTO && nodeFds.has(c.fd)) {
      if (sentClient >= 0) toNode.push(c.cpu - sentClient);
      sentNode = c.cpu;
      sentClient = -1;
    } else if (c.exit && c.nr === RECVFROM && nodeFds.has(c.fd) && c.ret > 0 && sentNode >= 0) {
      woke = lastWake > sentNode ? lastWake : c.cpu;
      waiting.push(woke - sentNode);
      sentNode = -1;
    } else if (!c.exit && c.nr === SENDTO && c.fd === client && woke >= 0) {
      toClient.push(c.cpu - woke);
      sentClient = c.cpu;
      woke = -1;
    }
  }
  return {
    toNode: median(toNode),
    toClient: median(toClient),
    waiting: median(waiting),
    requests: toClient.length,
  };
}

/**
 * The fds of `pid` that are TCP connections to `port` on loopback: its sockets' inodes
 * (`/proc/<pid>/fd`) matched with `/proc/net/tcp`'s connections whose remote port it is.
 */
export async function socketsTo(pid: number, port: number): Promise<Set<number>> {
  const inodes = new Set<string>();
  const table = await Deno.readTextFile("/proc/net/tcp");
  for (const line of table.split("\n").slice(1)) {
    const cols = line.trim().split(/\s+/);
    if (cols.length < 10) continue;
    if (parseInt(cols[2].split(":")[1], 16) === port) inodes.add(cols[9]);
  }
  const fds = new Set<number>();
  for await (const entry of Deno.readDir(`/proc/${pid}/fd`)) {
    const link = await Deno.readLink(`/proc/${pid}/fd/${entry.name}`).catch(() => "");
    const inode = /^socket:\[(\d+)\]$/.exec(link)?.[1];
    if (inode !== undefined && inodes.has(inode)) fds.add(Number(entry.name));
  }
  return fds;
}

/** Records `seconds` of `pids`' socket calls and switches; the `perf script` text. */
export async function recordPath(pids: number[], seconds: number): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-c1-path-" });
  try {
    const data = `${dir}/perf.data`;
    const mine = pids.map((p) => `common_pid == ${p}`).join(" || ");
    const switches = pids.map((p) => `prev_pid == ${p} || next_pid == ${p}`).join(" || ");
    const rec = await new Deno.Command("perf", {
      args: [
        "record",
        "-q",
        "-a",
        "-o",
        data,
        "-e",
        "raw_syscalls:sys_enter",
        "--filter",
        mine,
        "-e",
        "raw_syscalls:sys_exit",
        "--filter",
        mine,
        "-e",
        "sched:sched_switch",
        "--filter",
        switches,
        "--",
        "sleep",
        String(seconds),
      ],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!rec.success) {
      throw new Error(`perf record failed: ${new TextDecoder().decode(rec.stderr)}`);
    }
    const out = await new Deno.Command("perf", {
      args: ["script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
      stdout: "piped",
      stderr: "null",
    }).output();
    return new TextDecoder().decode(out.stdout);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
