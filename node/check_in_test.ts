import assert from "node:assert/strict";
import { checkInSchema, type HostReading } from "../shared/schemas.ts";
import type { Log } from "../shared/log.ts";
import {
  CheckInLoop,
  type CheckInOptions,
  describeFetchFailure,
  lookupDigestOf,
} from "./check_in.ts";
import { idDigestKey, LookupDigest, nameDigestKey } from "../shared/lookup_digest.ts";

const token = "k".repeat(32);
const reading: HostReading = {
  takenAt: 1,
  cpuCount: 2,
  cpuUsedPct: null,
  memoryTotalBytes: 10,
  memoryAvailableBytes: 5,
  swapTotalBytes: 0,
  swapFreeBytes: 0,
  dataDisk: null,
  sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
};

function recorder(): { log: Log; lines: { level: string; msg: string; cause?: unknown }[] } {
  const lines: { level: string; msg: string; cause?: unknown }[] = [];
  return { lines, log: (level, msg, fields) => lines.push({ level, msg, cause: fields?.cause }) };
}

function options(gatewayEndpoint: string, extra: Partial<CheckInOptions> = {}): CheckInOptions {
  return {
    gatewayEndpoint,
    nodeId: "node-a",
    endpoint: "http://127.0.0.1:3676",
    intervalSeconds: 15,
    build: "test",
    token,
    reading: () => reading,
    ...extra,
  };
}

/** A stub gateway whose answer the test sets per request. */
async function withGateway(
  fn: (
    origin: string,
    seen: { auth: string | null; body: unknown }[],
    answer: (r: () => Response) => void,
  ) => Promise<void>,
): Promise<void> {
  const seen: { auth: string | null; body: unknown }[] = [];
  let respond = () => Response.json({ ok: true });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    seen.push({ auth: req.headers.get("authorization"), body: await req.json() });
    return respond();
  });
  try {
    await fn(`http://127.0.0.1:${server.addr.port}`, seen, (r) => respond = r);
  } finally {
    await server.shutdown();
  }
}

Deno.test("CheckInLoop posts a body matching checkInSchema with the bearer token", async () => {
  await withGateway(async (origin, seen) => {
    const { log, lines } = recorder();
    const loop = new CheckInLoop(options(origin, { log }));
    assert.deepEqual(await loop.once(), { ok: true, status: 200 });
    assert.equal(seen[0].auth, `Bearer ${token}`);
    assert.deepEqual(checkInSchema.parse(seen[0].body), seen[0].body);
    assert.deepEqual(lines.map((l) => l.msg), ["checked in with the gateway"]);
  });
});

Deno.test("CheckInLoop logs a failure once per change and a recovery once", async () => {
  await withGateway(async (origin, _seen, answer) => {
    const { log, lines } = recorder();
    const loop = new CheckInLoop(options(origin, { log }));
    answer(() => Response.json({ message: "Node id taken: " + "x".repeat(500) }, { status: 409 }));
    const first = await loop.once();
    assert.equal(first.ok, false);
    assert.match(!first.ok ? first.cause : "", /^the gateway answered 409: Node id taken: x+…$/);
    assert.ok(!first.ok && first.cause.length < 450);
    await loop.once();
    answer(() => new Response("upstream down", { status: 502 }));
    await loop.once();
    answer(() => Response.json({}));
    await loop.once();
    await loop.once();
    assert.deepEqual(lines.map((l) => `${l.level} ${l.msg}`), [
      "warn check-in failed",
      "warn check-in failed",
      "info check-in recovered",
    ]);
    assert.match(String(lines[1].cause), /502: upstream down/);
  });
});

Deno.test("CheckInLoop logs the gateway's sentence cut at exactly 400 characters", async () => {
  await withGateway(async (origin, _seen, answer) => {
    const { log, lines } = recorder();
    const loop = new CheckInLoop(options(origin, { log }));
    // Every position differs from its neighbours, so a cut one character off shows.
    const sentence = Array.from({ length: 1000 }, (_, i) => String.fromCharCode(65 + i % 26))
      .join("");
    answer(() => Response.json({ message: sentence }, { status: 409 }));
    await loop.once();
    assert.equal(lines.length, 1, "the failure was logged");
    assert.equal(lines[0].msg, "check-in failed");
    assert.equal(lines[0].cause, `the gateway answered 409: ${sentence.slice(0, 400)}…`);
    // A sentence within the bound is logged whole, with no mark.
    const short = sentence.slice(0, 400);
    answer(() => Response.json({ message: short }, { status: 503 }));
    await loop.once();
    assert.equal(lines.length, 2, "the new failure was logged");
    assert.equal(lines[1].cause, `the gateway answered 503: ${short}`);
  });
});

Deno.test("CheckInLoop logs a cause whose numbers tick once, and again when its status changes", async () => {
  await withGateway(async (origin, _seen, answer) => {
    const { log, lines } = recorder();
    const loop = new CheckInLoop(options(origin, { log }));
    // The gateway's 409 for a live id counts the seconds since the other reporter's check-in.
    for (const ago of [3, 4, 12]) {
      answer(() =>
        Response.json({
          message: `Node id 'node-a' is checked in from http://10.0.0.7:3676, last check-in ` +
            `${ago} s ago: pick another DORMICE_NODE_ID`,
        }, { status: 409 })
      );
      await loop.once();
    }
    answer(() => Response.json({ message: "The gateway is restarting in 5 s" }, { status: 503 }));
    await loop.once();
    answer(() => Response.json({ message: "The gateway is restarting in 4 s" }, { status: 503 }));
    await loop.once();
    assert.deepEqual(lines.map((l) => `${l.level} ${l.msg}`), [
      "warn check-in failed",
      "warn check-in failed",
    ]);
    // The line carries the real numbers of the first occurrence.
    assert.match(String(lines[0].cause), /^the gateway answered 409: .*last check-in 3 s ago/);
    assert.match(String(lines[1].cause), /^the gateway answered 503: .*in 5 s$/);
  });
});

Deno.test("CheckInLoop never follows a redirect and names the variable to fix", async () => {
  await withGateway(async (origin, seen, answer) => {
    answer(() =>
      new Response(null, { status: 308, headers: { location: "https://elsewhere/checkIn" } })
    );
    const outcome = await new CheckInLoop(options(origin)).once();
    assert.equal(seen.length, 1);
    assert.equal(outcome.ok, false);
    assert.match(
      !outcome.ok ? outcome.cause : "",
      /308 redirecting to https:\/\/elsewhere\/checkIn.*DORMICE_GATEWAY_ENDPOINT/,
    );
  });
});

Deno.test("CheckInLoop names ECONNREFUSED against a closed port", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close();
  const outcome = await new CheckInLoop(options(`http://127.0.0.1:${port}`)).once();
  assert.deepEqual(outcome, {
    ok: false,
    cause: "ECONNREFUSED: nothing listens at that address and port",
  });
});

Deno.test("describeFetchFailure() names timeout, DNS and TLS", () => {
  assert.equal(
    describeFetchFailure(new DOMException("signal timed out", "TimeoutError"), 5000),
    "timeout: no answer within 5000 ms",
  );
  assert.match(
    describeFetchFailure(new TypeError("dns error: failed to lookup address information"), 1),
    /^DNS: /,
  );
  assert.match(
    describeFetchFailure(new TypeError("invalid peer certificate: UnknownIssuer"), 1),
    /^TLS: /,
  );
  assert.equal(describeFetchFailure(new Error("x".repeat(500)), 1).length, 401);
});

Deno.test("CheckInLoop bounds each attempt and start()/stop() clean up", async () => {
  let calls = 0;
  const hanging = (request: Request): Promise<Response> => {
    calls++;
    return new Promise((_resolve, reject) => {
      request.signal.addEventListener("abort", () => reject(request.signal.reason));
    });
  };
  const { log, lines } = recorder();
  const loop = new CheckInLoop(
    options("http://127.0.0.1:1", { fetch: hanging, timeoutMs: 5, log }),
  );
  assert.deepEqual(await loop.once(), { ok: false, cause: "timeout: no answer within 5 ms" });
  loop.start();
  await loop.stop();
  assert.equal(calls, 2);
  assert.deepEqual(lines.map((l) => l.cause), ["timeout: no answer within 5 ms"]);
});

Deno.test("CheckInLoop carries the outbox's events and forgets them only once accepted", async () => {
  const { LifecycleOutbox } = await import("./lifecycle_outbox.ts");
  await withGateway(async (origin, seen, answer) => {
    const outbox = new LifecycleOutbox();
    outbox.add({
      id: "e1",
      type: "timed_out",
      at: 1,
      reason: "timeout",
      detail: "its timeout passed",
      sandbox: { id: "sbx_1", name: "agent-1", team: "default" },
    });
    const outcomes: boolean[] = [];
    const loop = new CheckInLoop(options(origin, {
      events: outbox,
      onOutcome: (o) => outcomes.push(o.ok),
    }));
    answer(() => Response.json({ message: "busy" }, { status: 503 }));
    await loop.once();
    assert.equal(outbox.size, 1, "a refused check-in keeps its events");
    answer(() => Response.json({ ok: true }));
    await loop.once();
    assert.equal(outbox.size, 0);
    assert.deepEqual(outcomes, [false, true]);
    const bodies = seen.map((s) => checkInSchema.parse(s.body));
    assert.deepEqual(bodies.map((b) => b.events?.map((e) => e.id)), [["e1"], ["e1"]]);
    await loop.once();
    assert.equal((seen[2].body as { events?: unknown }).events, undefined);
  });
});

Deno.test("CheckInLoop with several gateways moves to the next when one does not answer or fails", async () => {
  await withGateway(async (second, seen, answer) => {
    const { log, lines } = recorder();
    const dead = "http://127.0.0.1:9"; // nothing listens on the discard port
    const loop = new CheckInLoop(options(dead, { log, gatewayEndpoints: [dead, second] }));
    // The dead one is skipped within the same attempt: the node never misses a check-in.
    assert.deepEqual(await loop.once(), { ok: true, status: 200 });
    assert.equal(loop.url, `${second}/checkIn`);
    assert.equal(seen.length, 1);
    assert.ok(lines.some((l) => l.msg === "check-in moves to the next gateway"));
    // It stays with the one that answers.
    await loop.once();
    assert.equal(seen.length, 2);
    // A 4xx is the fleet's verdict, the same from every gateway: no move.
    answer(() => Response.json({ message: "taken" }, { status: 409 }));
    const refused = await loop.once();
    assert.equal(refused.ok, false);
    assert.equal(loop.url, `${second}/checkIn`);
    // A 5xx moves on (to the dead one, which fails too: the attempt fails, once each).
    answer(() => new Response("busy", { status: 503 }));
    const failed = await loop.once();
    assert.equal(failed.ok, false);
    assert.equal(seen.length, 4);
    assert.equal(loop.url, `${dead}/checkIn`);
  });
});

Deno.test("a check-in carries the node's lookup digest: names, ids and creates in flight", () => {
  const loop = new CheckInLoop(options("http://127.0.0.1:1", {
    lookupDigest: () =>
      lookupDigestOf([
        { id: "sbx_1", name: "agent-1", team: "default" },
        { id: "sbx_2", name: "agent-1", team: "red" },
      ], ["red/being-built"]),
  }));
  const body = checkInSchema.parse(loop.body());
  const digest = LookupDigest.fromWire(body.lookupDigest!);
  assert.equal(digest.count, 5);
  for (
    const key of [
      nameDigestKey("default", "agent-1"),
      nameDigestKey("red", "agent-1"),
      idDigestKey("sbx_1"),
      idDigestKey("sbx_2"),
      nameDigestKey("red", "being-built"),
    ]
  ) assert.equal(digest.mayHold(key), true, key);
  assert.equal(digest.mayHold(nameDigestKey("blue", "agent-1")), false);
  // A node without the option sends none: the gateway then asks it on every miss.
  assert.equal(new CheckInLoop(options("http://127.0.0.1:1")).body().lookupDigest, undefined);
});

Deno.test("pushDirectCreate: refused while a gateway that skips by digest cannot hear it", async () => {
  await withGateway(async (origin, seen, answer) => {
    const loop = new CheckInLoop(options(origin));
    // A gateway that asks every node: a failed push does not stop the create.
    answer(() => Response.json({ ok: true, lookupDigests: "off" }));
    await loop.once();
    assert.equal(loop.gatewaySkips, false);
    answer(() => Response.json({ message: "down for a moment" }, { status: 503 }));
    await loop.pushDirectCreate("sandbox 'a'");
    // A gateway that skips by digest: the push must reach it.
    answer(() => Response.json({ ok: true, lookupDigests: "on" }));
    await loop.pushDirectCreate("sandbox 'a'");
    assert.equal(loop.gatewaySkips, true);
    answer(() => Response.json({ message: "down for a moment" }, { status: 503 }));
    await assert.rejects(
      loop.pushDirectCreate("sandbox 'a'"),
      (e: Error & { status?: number }) =>
        e.status === 503 && /sandbox 'a' directly .*through the gateway/.test(e.message),
    );
    assert.equal(seen.length, 4);
  });
});

Deno.test("pushDirectCreate names the create it was pushed for; a regular check-in names none", async () => {
  const bodies: Record<string, unknown>[] = [];
  const fetchFn = (async (request: Request) => {
    bodies.push(await request.json());
    return Response.json({ ok: true, lookupDigests: "on" });
  }) as typeof fetch;
  const loop = new CheckInLoop(options("http://gw.test", { fetch: fetchFn }));
  await loop.pushDirectCreate("sandbox 'a'", { team: "acme", name: "a" });
  await loop.pushDirectCreate("sandbox 'a'", { team: "acme", name: "a", id: "sbx_1" });
  await loop.once();
  assert.deepEqual(bodies.map((b) => b.directCreate), [
    { team: "acme", name: "a" },
    { team: "acme", name: "a", id: "sbx_1" },
    undefined,
  ]);
  // The gateway's schema takes it.
  assert.equal(checkInSchema.safeParse(bodies[1]).success, true);
});

Deno.test("check-ins never overlap: one asked for during another starts when it ends", async () => {
  let inFlight = 0;
  let most = 0;
  const fetchFn = (async () => {
    most = Math.max(most, ++inFlight);
    for (let i = 0; i < 5; i++) await new Promise<void>((resolve) => queueMicrotask(resolve));
    inFlight--;
    return Response.json({ ok: true });
  }) as typeof fetch;
  const loop = new CheckInLoop(options("http://gw.test", { fetch: fetchFn }));
  await Promise.all([loop.once(), loop.once(), loop.pushDirectCreate("sandbox 'a'")]);
  assert.equal(most, 1);
});

Deno.test("CheckInLoop sends its extra header beside the fleet token, and refuses one that would replace it", async () => {
  const seen: Request[] = [];
  const loop = new CheckInLoop(options("https://host.test/fleet", {
    header: { name: "x-host-auth", value: "s3cret" },
    fetch: (request) => {
      seen.push(request);
      return new Response(null, { status: 204 });
    },
  }));
  assert.deepEqual(await loop.once(), { ok: true, status: 204 });
  assert.equal(seen[0].url, "https://host.test/fleet/checkIn");
  assert.equal(seen[0].headers.get("x-host-auth"), "s3cret");
  assert.equal(seen[0].headers.get("authorization"), `Bearer ${token}`);
  for (
    const header of [{ name: "Authorization", value: "s3cret" }, {
      name: "bad name",
      value: "s3cret",
    }]
  ) {
    assert.throws(
      () => new CheckInLoop(options("https://host.test/fleet", { header })),
      (error: Error) => {
        assert.ok(error instanceof TypeError);
        assert.match(error.message, /^Cannot create the check-in loop: header: /);
        assert.ok(!error.message.includes("s3cret"), "the value is never repeated");
        return true;
      },
    );
  }
});
