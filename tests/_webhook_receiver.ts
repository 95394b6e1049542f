/**
 * A webhook receiver on loopback for tests: it records every delivery with whether its
 * signature verified, and can go down (nothing listens on its port) and come back on the same
 * port, as a receiver being redeployed does.
 *
 * @module
 */
import { verifyWebhook } from "../gateway/observe/webhooks.ts";
import type { LifecycleEvent } from "../gateway/observe/webhooks.ts";

/** One delivery as the receiver saw it. */
export interface Delivery {
  event: LifecycleEvent;
  signed: boolean;
  eventIdHeader: string | null;
}

/** A running (or paused) receiver. */
export interface WebhookReceiver {
  url: string;
  port: number;
  deliveries: Delivery[];
  /**
   * Deliveries that arrive from now on are recorded and then held unanswered (a receiver that
   * hangs) until `release()`; each is listed with its request's signal, so a test sees whether
   * the sender gave up on it.
   */
  hold(): void;
  /** The held deliveries, unanswered until `release()`. */
  held: { delivery: Delivery; signal: AbortSignal }[];
  /** Answers the held deliveries and stops holding. */
  release(): void;
  /** Stops listening: deliveries meet a refused connection. */
  down(): Promise<void>;
  /** Listens again on the same port. */
  up(): void;
  stop(): Promise<void>;
}

/** Starts a receiver verifying with `secret`. */
export function startWebhookReceiver(secret: string): WebhookReceiver {
  const deliveries: Delivery[] = [];
  const held: { delivery: Delivery; signal: AbortSignal }[] = [];
  let holding: { promise: Promise<void>; resolve: () => void } | undefined;
  const handler = async (request: Request) => {
    const body = await request.text();
    const signed = await verifyWebhook(secret, body, request.headers.get("x-dormice-signature"));
    const delivery = {
      event: JSON.parse(body),
      signed,
      eventIdHeader: request.headers.get("x-dormice-event-id"),
    };
    deliveries.push(delivery);
    if (holding) {
      held.push({ delivery, signal: request.signal });
      await holding.promise;
    }
    return new Response(null, { status: signed ? 204 : 401 });
  };
  let server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, handler);
  const port = server.addr.port;
  return {
    url: `http://127.0.0.1:${port}/hooks/dormice`,
    port,
    deliveries,
    held,
    hold() {
      holding ??= Promise.withResolvers<void>();
    },
    release() {
      holding?.resolve();
      holding = undefined;
    },
    async down() {
      await server.shutdown();
    },
    up() {
      server = Deno.serve({ hostname: "127.0.0.1", port, onListen() {} }, handler);
    },
    async stop() {
      holding?.resolve();
      await server.shutdown().catch(() => {});
    },
  };
}
