/**
 * How the native face serves a verb: `POST /<verb>` with the fleet bearer, the caller's team, a
 * JSON body under its cap checked by the verb's schema, and a 405 for any other method.
 *
 * @module
 */
import type { Context, Hono } from "hono";
import type { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { type BodyCapOptions, readFlatJsonObject, readJsonObject } from "../../shared/json_body.ts";
import { describeZodError } from "../../shared/schemas.ts";
import { teamOfRequest } from "../../shared/teams.ts";
import { requireFleetBearer, tokensEqual } from "../../shared/token.ts";

/** What a verb's handler is given: its checked body, the caller's team, the request's headers. */
export type VerbHandler<T> = (
  input: T,
  team: string | undefined,
  headers: Headers,
) => Promise<unknown> | unknown;

/** The verbs of one native face, each added as a route of its app. */
export class NativeVerbs {
  #app: Hono;
  #token: string;
  #bodyCap: BodyCapOptions;
  #messageCap: BodyCapOptions;

  /**
   * Verbs on `app` behind `token`; `writeFile`'s body is read under `bodyCap`, every other
   * verb's under `messageCap`.
   */
  constructor(
    app: Hono,
    caps: { token: string; bodyCap: BodyCapOptions; messageCap: BodyCapOptions },
  ) {
    this.#app = app;
    this.#token = caps.token;
    this.#bodyCap = caps.bodyCap;
    this.#messageCap = caps.messageCap;
  }

  /**
   * Adds `POST /<verbName>`. `team` is the gateway's X-Dormice-Team, read only once the fleet
   * token is checked: the gateway names the caller's team, and no one else may. Absent, the
   * caller is the operator.
   */
  add<T>(verbName: string, schema: z.ZodType<T>, run: VerbHandler<T>): void {
    this.#app.post(`/${verbName}`, async (c) => {
      requireFleetBearer(
        c.req.header("authorization"),
        (given: string) => tokensEqual(given, this.#token),
        "this node's",
      );
      const team = teamOfRequest(c.req.raw.headers);
      // Only writeFile carries a file: its body is read a slice at a time, under the larger cap.
      const { value } = verbName === "writeFile"
        ? await readFlatJsonObject(c.req.raw, { ...this.#bodyCap, verb: verbName })
        : await readJsonObject(c.req.raw, this.#messageCap);
      const input = parse(verbName, schema, value);
      const answer = await run(input, team, c.req.raw.headers);
      if (answer instanceof Response) return answer;
      return c.json(answer as Record<string, unknown>);
    });
    this.#app.all(`/${verbName}`, (c) => methodNotAllowed(c, "POST"));
  }
}

/** `body` checked by `schema`; a 400 naming the verb and the field when it fails. */
function parse<T>(verb: string, schema: z.ZodType<T>, body: unknown): T {
  // reportInput lets describeZodError tell a missing field from a wrong type.
  const r = schema.safeParse(body, { reportInput: true });
  if (!r.success) {
    throw new HttpError(400, `Invalid body for ${verb}: ${describeZodError(r.error)}`);
  }
  return r.data;
}

/** A 405 naming the method to use. */
export function methodNotAllowed(c: Context, allow: string): Response {
  return c.json(
    {
      message: `${c.req.method} is not allowed on ${new URL(c.req.url).pathname}: use ${allow}`,
    },
    405,
    { allow },
  );
}
