/**
 * The operator's view on the gateway: `GET /metrics` (Prometheus text; the root's bearer gate
 * lets only the fleet token through, see `gateway/keys/auth.ts`) and the fleet page under `/ui`
 * (`ui/app.ts`). `createGateway()` mounts both.
 *
 * @module
 */
import type { Hono } from "hono";
import type { GatewayParts } from "./parts.ts";
import { mountFleetPage } from "./ui/app.ts";

/**
 * Mounts `GET /metrics` and the fleet page on the gateway's root app.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * const token = "t".repeat(32);
 * const gateway = createGateway({ token }); // mounts the operator's view itself
 * const res = await gateway.fetch(
 *   new Request("http://gw/metrics", { headers: { authorization: `Bearer ${token}` } }),
 * );
 * console.log((await res.text()).includes("dormice_gateway_nodes")); // true
 * gateway.close();
 * ```
 */
export function mountOperatorView(app: Hono, parts: GatewayParts): void {
  app.get("/metrics", async () =>
    new Response(await parts.metrics.text(), {
      headers: { "content-type": parts.metrics.contentType, "cache-control": "no-store" },
    }));
  mountFleetPage(app, parts);
}
