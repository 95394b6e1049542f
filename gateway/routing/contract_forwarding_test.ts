// The forwarding contract: what a routed request to a cached sandbox gets from the gateway,
// whichever way it takes to its node, the bytes lane (the bytes engine serving it from its
// bytes) or the object path (a Request through the app). Every case runs against both, as the
// executors' contract runs against both executors.
import assert from "node:assert/strict";
import { teamScopedName } from "../../shared/teams.ts";
import { within } from "../../shared/http1/_server_fixtures_test.ts";
import {
  execBody,
  type ForwardingPath,
  hangUpOnExec,
  holding,
  NODE,
  rig,
  type RigOptions,
  settlesWithin,
} from "./_forwarding_fixtures_test.ts";

const encoder = new TextEncoder();
const paths: ForwardingPath[] = ["bytes lane", "object path"];

/**
 * A rig on `path`, and a check that the request was answered by that path: served by the lane
 * once, or never by it (the object path's engine has no lane).
 */
async function rigOn(path: ForwardingPath, options: RigOptions) {
  const r = await rig({ ...options, path });
  return {
    r,
    /** Marks the lane's counts; the returned check asserts which path answered since. */
    watch() {
      const delta = r.mark();
      return () =>
        assert.deepEqual(
          delta(),
          path === "bytes lane" ? { served: 1, handedBack: 0 } : { served: 0, handedBack: 0 },
          `answered by the ${path}`,
        );
    },
  };
}

for (const path of paths) {
  Deno.test(`forwarding contract (${path}): the node's head reaches the client before its body ends`, async () => {
    // Each piece is made only once the client has what came before it: the head, then "one,".
    const gates = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
    const inOrder: boolean[] = [];
    const { r, watch } = await rigOn(path, {
      names: ["x"],
      answer: () =>
        new Response(
          new ReadableStream<Uint8Array>({
            async pull(c) {
              const n = inOrder.length;
              if (n === 2) return c.close();
              inOrder.push(await settlesWithin(gates[n].promise, 3000));
              c.enqueue(encoder.encode(["one,", "two"][n]));
            },
          }),
          { headers: { "content-type": "text/plain" } },
        ),
    });
    try {
      await r.cache("x");
      const answered = watch();
      const res = await within(
        fetch(`${r.base}/execCommand`, {
          method: "POST",
          headers: r.fleetAuth,
          body: execBody("x"),
        }),
        5000,
        "the streamed answer's head",
      );
      gates[0].resolve();
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("content-type"), "text/plain");
      const reader = res.body!.getReader();
      const decoder = new TextDecoder();
      const first = await within(reader.read(), 5000, "the first piece");
      assert.equal(decoder.decode(first.value), "one,");
      gates[1].resolve();
      let text = decoder.decode(first.value);
      for (let p = await within(reader.read(), 5000, "a piece"); !p.done;) {
        text += decoder.decode(p.value);
        p = await within(reader.read(), 5000, "a piece");
      }
      assert.equal(text, "one,two");
      assert.deepEqual(inOrder, [true, true], "the client had the head, then one, in time");
      answered();
    } finally {
      for (const g of gates) g.resolve();
      await r.close();
    }
  });

  Deno.test(`forwarding contract (${path}): a client that hangs up aborts the node's request`, async () => {
    const arrived = Promise.withResolvers<void>(), aborted = Promise.withResolvers<void>();
    const { r, watch } = await rigOn(path, { names: ["x"], answer: holding(arrived, aborted) });
    try {
      await r.cache("x");
      const answered = watch();
      await hangUpOnExec(r, arrived.promise);
      assert.ok(await settlesWithin(aborted.promise, 2000), "the node's request was aborted");
      answered();
    } finally {
      await r.close();
    }
  });

  Deno.test(`forwarding contract (${path}): a node's 404 makes the Finder re-check the cached name and evict it`, async () => {
    const { r, watch } = await rigOn(path, {
      names: ["x"],
      answer: (s) => {
        r.names.delete(JSON.parse(s.body).name);
        return Response.json({ message: "No sandbox named 'x'" }, { status: 404 });
      },
    });
    try {
      await r.cache("x");
      const key = teamScopedName("default", "x");
      assert.ok(r.gateway.finder.cached("name", key), "the name is cached before");
      const answered = watch();
      const before = r.seen.length;
      const res = await r.exec("x");
      answered();
      assert.equal(res.status, 404);
      assert.deepEqual(JSON.parse(res.text), { message: "No sandbox named 'x'" });
      const after = r.seen.slice(before);
      assert.deepEqual(after.map((s) => s.path), ["/execCommand", "/lookupSandbox"]);
      assert.deepEqual(JSON.parse(after[1].body), { id: "id-x" });
      assert.equal(r.gateway.finder.cached("name", key), undefined);
    } finally {
      await r.close();
    }
  });

  Deno.test(`forwarding contract (${path}): no head within headTimeoutMs is a 504 naming the node, and its request is aborted`, async () => {
    const arrived = Promise.withResolvers<void>(), aborted = Promise.withResolvers<void>();
    const { r, watch } = await rigOn(path, {
      names: ["x"],
      headTimeoutMs: 300,
      answer: holding(arrived, aborted),
    });
    try {
      await r.cache("x");
      const answered = watch();
      const res = await r.exec("x");
      assert.equal(res.status, 504, res.text);
      const { message } = JSON.parse(res.text);
      assert.match(message, new RegExp(`Node '${NODE}'`));
      assert.match(message, /within 300 ms/);
      assert.match(message, /DORMICE_GATEWAY_HEAD_TIMEOUT_MS/);
      answered();
      assert.ok(await settlesWithin(aborted.promise, 2000), "the node's request was aborted");
    } finally {
      await r.close();
    }
  });

  Deno.test(`forwarding contract (${path}): a node that went away is a 502 naming it`, async () => {
    const { r, watch } = await rigOn(path, { names: ["x"] });
    try {
      await r.cache("x");
      await r.stopStub();
      const answered = watch();
      const res = await r.exec("x");
      assert.equal(res.status, 502, res.text);
      const { message } = JSON.parse(res.text);
      assert.match(message, new RegExp(`Node '${NODE}' at ${r.endpoint} did not answer`));
      answered();
    } finally {
      await r.close();
    }
  });
}
