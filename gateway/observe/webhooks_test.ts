import assert from "node:assert/strict";
import { Registry } from "prom-client";
import { type LifecycleEvent, signWebhook, verifyWebhook, WebhookSender } from "./webhooks.ts";
import { recordingLog } from "../_fixtures_test.ts";

const secret = "s".repeat(32);

function event(n: number, type: LifecycleEvent["type"] = "created"): LifecycleEvent {
  return {
    id: `e${n}`,
    type,
    at: new Date().toISOString(),
    sandbox: { id: `sbx_${n}`, name: `agent-${n}`, team: "default" },
    nodeId: "node-a",
    reason: "placed",
    detail: "test",
    source: "gateway",
  };
}

/** A fetch that answers with `statuses` in turn (the last one repeats), recording each body. */
function scripted(statuses: (number | "refused")[]) {
  const seen: { body: string; signature: string | null }[] = [];
  let i = 0;
  const fetchFn = async (request: Request) => {
    const status = statuses[Math.min(i++, statuses.length - 1)];
    seen.push({
      body: await request.text(),
      signature: request.headers.get("x-dormice-signature"),
    });
    if (status === "refused") throw new TypeError("tcp connect error: Connection refused");
    return new Response(null, { status });
  };
  return { fetch: fetchFn, seen };
}

async function metric(registry: Registry, name: string, labels: Record<string, string> = {}) {
  const m = await registry.getSingleMetric(name)!.get();
  return m.values.filter((v) =>
    Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want)
  ).reduce((s, v) => s + v.value, 0);
}

Deno.test("signWebhook() is what verifyWebhook() accepts, and only for that body and time", async () => {
  const header = await signWebhook(secret, '{"id":"e1"}', 1_700_000_000);
  assert.ok(await verifyWebhook(secret, '{"id":"e1"}', header, { nowSeconds: 1_700_000_100 }));
  assert.ok(!await verifyWebhook(secret, '{"id":"e2"}', header, { nowSeconds: 1_700_000_100 }));
  assert.ok(
    !await verifyWebhook("x".repeat(32), '{"id":"e1"}', header, {
      nowSeconds: 1_700_000_100,
    }),
  );
  // A replay ten minutes later is refused.
  assert.ok(!await verifyWebhook(secret, '{"id":"e1"}', header, { nowSeconds: 1_700_000_600 }));
  assert.ok(!await verifyWebhook(secret, "{}", null));
});

Deno.test("WebhookSender retries a failing receiver with backoff and keeps the order", async () => {
  const { fetch, seen } = scripted(["refused", 503, 204]);
  const registry = new Registry();
  const { log, lines } = recordingLog();
  const sender = new WebhookSender({
    url: "http://127.0.0.1:1/hook",
    secret,
    fetch,
    log,
    registry,
    initialBackoffMs: 10,
    maxBackoffMs: 20,
  });
  sender.send(event(1));
  sender.send(event(2, "killed"));
  assert.ok(await sender.idle(2000));
  // e1 three times (refused, 503, delivered), then e2 once.
  assert.deepEqual(seen.map((s) => JSON.parse(s.body).id), ["e1", "e1", "e1", "e2"]);
  for (const s of seen) assert.ok(await verifyWebhook(secret, s.body, s.signature));
  assert.equal(
    await metric(registry, "dormice_gateway_webhook_deliveries_total", {
      outcome: "failed",
    }),
    2,
  );
  assert.equal(
    await metric(registry, "dormice_gateway_webhook_deliveries_total", {
      outcome: "ok",
    }),
    2,
  );
  // Failures logged when the cause changes, the recovery once.
  assert.deepEqual(lines.map((l) => l.msg), [
    "webhook delivery failed; retrying",
    "webhook delivery failed; retrying",
    "webhook deliveries succeed",
  ]);
  await sender.close();
});

Deno.test("WebhookSender drops the oldest events past its bound, counts them, logs once", async () => {
  const registry = new Registry();
  const { log, lines } = recordingLog();
  const sender = new WebhookSender({
    url: "http://127.0.0.1:1/hook",
    secret,
    fetch: scripted(["refused"]).fetch,
    log,
    registry,
    maxQueue: 3,
    initialBackoffMs: 60_000,
  });
  for (let i = 1; i <= 10; i++) sender.send(event(i));
  // One in delivery (e1) and the two newest waiting.
  assert.equal(sender.pending, 3);
  assert.equal(
    await metric(registry, "dormice_gateway_webhook_events_dropped_total", {
      reason: "queue_full",
    }),
    7,
  );
  assert.equal(lines.filter((l) => /queue full/.test(l.msg)).length, 1);
  await sender.close();
  assert.ok(lines.some((l) => /not delivered/.test(l.msg) && l.fields.events === 3));
});

Deno.test("WebhookSender drops an event the receiver refuses (4xx) and goes on", async () => {
  const { fetch, seen } = scripted([400, 204]);
  const registry = new Registry();
  const sender = new WebhookSender({
    url: "http://127.0.0.1:1/hook",
    secret,
    fetch,
    registry,
    log: () => {},
  });
  sender.send(event(1));
  sender.send(event(2));
  assert.ok(await sender.idle(2000));
  assert.deepEqual(seen.map((s) => JSON.parse(s.body).id), ["e1", "e2"]);
  assert.equal(
    await metric(registry, "dormice_gateway_webhook_events_dropped_total", {
      reason: "refused",
    }),
    1,
  );
  await sender.close();
});

Deno.test("WebhookSender refuses a URL that is not http(s) and an empty secret", () => {
  assert.throws(() => new WebhookSender({ url: "ftp://x/", secret }), TypeError);
  assert.throws(() => new WebhookSender({ url: "http://x/", secret: "" }), TypeError);
});
