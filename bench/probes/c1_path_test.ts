import assert from "node:assert/strict";
import { parsePerfScript, splitPath } from "./c1_path.ts";

/** A `perf script` line at `us` µs past a second. */
const at = (us: number, tid: number, event: string, trace: string) =>
  `deno ${tid} [000] ${(1 + us / 1e6).toFixed(6)}: ${event}: ${trace}`;
const enter = (us: number, nr: number, fd: number) =>
  at(us, 100, "raw_syscalls:sys_enter", `NR ${nr} (${fd.toString(16)}, 0, 0, 0, 0, 0)`);
const exit = (us: number, nr: number, ret: number) =>
  at(us, 100, "raw_syscalls:sys_exit", `NR ${nr} = ${ret}`);
const sw = (us: number, from: number, to: number) =>
  at(
    us,
    from,
    "sched:sched_switch",
    `prev_comm=x prev_pid=${from} prev_prio=120 prev_state=S ==> next_comm=y next_pid=${to} next_prio=120`,
  );
const SEND = 44, RECV = 45, EPOLL = 232, CLIENT = 7, NODE = 9, WRK = 555;

Deno.test("splitPath() counts a proxy's CPU time between its sends, not the time it was off it", () => {
  const text = [
    enter(0, SEND, NODE), // the first request to the node
    enter(2, EPOLL, 3),
    sw(3, 100, 0), // asleep while the node works
    sw(50, 0, 100),
    exit(51, EPOLL, 1),
    enter(52, RECV, NODE),
    exit(53, RECV, 200),
    enter(61, SEND, CLIENT), // toClient: 61 − 51
    exit(62, SEND, 200),
    sw(63, 100, WRK), // wrk, woken on this core, runs first
    sw(100, WRK, 100),
    enter(101, EPOLL, 3),
    exit(102, EPOLL, 1),
    enter(103, RECV, CLIENT),
    exit(104, RECV, 199),
    at(110, 4242, "raw_syscalls:sys_enter", "NR 44 (9, 0, 0, 0, 0, 0)"), // another thread
    enter(120, SEND, NODE), // toNode: (63 − 61) + (120 − 100), wrk's 37 µs not counted
    enter(125, EPOLL, 3),
    sw(126, 100, 0),
    sw(200, 0, 100),
    exit(201, EPOLL, 1), // waiting: (126 − 120) + (201 − 200)
    enter(202, RECV, NODE),
    exit(203, RECV, 200),
    enter(212, SEND, CLIENT), // toClient: 212 − 201
    "a line perf printed that is no event",
  ].join("\n");
  const split = splitPath(parsePerfScript(text), 100, new Set([NODE]));
  const tenth = (x: number) => Math.round(x * 10) / 10;
  // Medians of two requests' 10 and 11 µs to the client, and of waits of 4 and 7 µs: the first
  // request's wait, from the recording's first send, counts the 1 µs between its wake and exit.
  assert.deepEqual(
    {
      toNode: tenth(split.toNode),
      toClient: tenth(split.toClient),
      waiting: tenth(split.waiting),
      requests: split.requests,
    },
    { toNode: 22, toClient: 10.5, waiting: 5.5, requests: 2 },
  );
});
