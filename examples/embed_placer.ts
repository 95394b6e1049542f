/**
 * Embedding the placer: an existing Hono service (here, a tiny "jobs" API) hosts the Dormice
 * Fleet and Placer itself. Nodes point `DORMICE_GATEWAY_ENDPOINT` at this service, and it answers
 * "where should this sandbox go?" from the check-ins it receives, without running a gateway.
 *
 * Run it: `deno run --allow-net=127.0.0.1 --allow-env=DORMICE_API_TOKEN,PORT examples/embed_placer.ts`
 *
 * @module
 */
import { Hono } from "hono";
import { Fleet, HttpError, Placer } from "../mod.ts";
import { bearerToken, tokensEqual } from "../shared/mod.ts";

/** Options of {@linkcode createPlacementService}. */
export interface PlacementServiceOptions {
  /** The fleet token the nodes check in with. */
  token: string;
  /** The service's own Fleet (an in-memory one by default). */
  fleet?: Fleet;
}

/**
 * The service: its own routes (`GET /jobs`), plus `POST /checkIn` for the nodes and
 * `GET /where?name=<sandbox>` answering with the chosen node and the placement's explain.
 *
 * @example
 * ```ts ignore
 * const service = createPlacementService({ token });
 * Deno.serve(service.app.fetch);
 * ```
 */
export function createPlacementService(
  options: PlacementServiceOptions,
): { app: Hono; fleet: Fleet; placer: Placer; close(): void } {
  const fleet = options.fleet ?? new Fleet();
  const placer = new Placer({ fleet });
  const app = new Hono();

  // The service's existing business, untouched by the embedding.
  app.get("/jobs", (c) => c.json({ jobs: [] }));

  app.post("/checkIn", async (c) => {
    const given = bearerToken(c.req.header("authorization"));
    if (given === undefined || !tokensEqual(given, options.token)) {
      return c.json({ message: "Send the fleet token as 'Authorization: Bearer <token>'" }, 401);
    }
    const body = await c.req.json().catch(() => undefined);
    try {
      // checkIn holds the body to the check-in route's rules: a 400 names each wrong field.
      return c.json({ ok: true, outcome: fleet.checkIn(body) });
    } catch (error) {
      if (!(error instanceof HttpError)) throw error;
      return c.json({ message: error.message }, error.status === 409 ? 409 : 400);
    }
  });

  app.get("/where", (c) => {
    const name = c.req.query("name");
    // `place` counts the choice until the node's next check-in, so a burst spreads out.
    const choice = name ? placer.place(name) : placer.pick();
    if (!choice.ok) {
      return c.json({ message: choice.message, explain: choice.explain }, 503, {
        "retry-after": String(choice.retryAfterSeconds),
      });
    }
    return c.json({
      nodeId: choice.node.id,
      endpoint: choice.node.endpoint,
      score: choice.score,
      explain: choice.explain,
    });
  });

  return { app, fleet, placer, close: () => fleet.close() };
}

if (import.meta.main) {
  const token = Deno.env.get("DORMICE_API_TOKEN") ?? "";
  if (token.length < 32) {
    console.error("DORMICE_API_TOKEN must be the fleet token (at least 32 characters)");
    Deno.exit(2);
  }
  const service = createPlacementService({ token });
  Deno.serve(
    { hostname: "127.0.0.1", port: Number(Deno.env.get("PORT") ?? 8080) },
    service.app.fetch,
  );
}
