/**
 * `gateway/faces/ui/` owns the fleet page: its routes (`app.ts`), what it reads of the parts
 * (`data.ts`), its HTML (`render.ts`) and its browser session (`session.ts`).
 *
 * The fleet page's routes, all under `/ui` (the root's bearer gate leaves them alone: a browser
 * sends the session cookie instead, see `session.ts`):
 *
 * | route | what |
 * |---|---|
 * | `GET /ui` | the login form without a live session; the fleet page with one (filters `team`, `state`, `node`, `page` in the query) |
 * | `POST /ui/login` | a form with `token`: the fleet token opens a session (cookie) and goes back to `/ui`; anything else is the form again with a 401 |
 * | `POST /ui/logout` | ends the session and clears the cookie |
 * | `GET /ui/fragments` | JSON `{at, sections:{nodes, sandboxes, placements, volumes}}`, the page's sections as HTML, for its refresh script; 401 without a session |
 * | `GET /ui/sandboxes/<id>` | one sandbox's details |
 *
 * Every HTML answer carries a CSP allowing only its own inline style and script (by nonce) and
 * requests to the gateway itself, is never cached, and may not be framed.
 *
 * @module
 */
import type { Context, Hono } from "hono";
import type { GatewayParts } from "../parts.ts";
import { HttpError } from "../../../shared/http_error.ts";
import { readBodyText } from "../../../shared/json_body.ts";
import { FleetPageData, parseFilters } from "./data.ts";
import { detailsPage, fleetPage, fleetSections, loginPage, messagePage } from "./render.ts";
import { sessionCookie, sessionOf, UiSessions } from "./session.ts";

/** Options of {@linkcode mountFleetPage}. */
export interface FleetPageOptions {
  /** The sessions; a fresh in-memory set by default. */
  sessions?: UiSessions;
}

/** A login form body is one token: anything larger is not one. */
const maxLoginBytes = 4096;

/**
 * Mounts the fleet page's routes on the gateway's root app.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * const gateway = createGateway({ token: "t".repeat(32) }); // mounts the page itself
 * const res = await gateway.fetch(new Request("http://gw/ui"));
 * console.log(res.status, res.headers.get("content-type")); // 200 "text/html; charset=utf-8"
 * await res.body?.cancel();
 * gateway.close();
 * ```
 */
export function mountFleetPage(app: Hono, parts: GatewayParts, options: FleetPageOptions = {}) {
  const sessions = options.sessions ?? new UiSessions();
  const data = new FleetPageData(parts);
  const signedIn = (c: Context) => sessions.valid(sessionOf(c.req.raw.headers));
  const secure = (c: Context) => new URL(c.req.url).protocol === "https:";

  app.get("/ui", async (c) => {
    const nonce = newNonce();
    if (!signedIn(c)) return html(loginPage(nonce), 200, nonce);
    const view = await data.view(parseFilters(new URL(c.req.url).searchParams));
    return html(fleetPage(view, nonce), 200, nonce);
  });

  app.post("/ui/login", async (c) => {
    sameOrigin(c);
    const text = await readBodyText(c.req.raw, {
      maxBytes: maxLoginBytes,
      tooLargeHint: "send only the token field",
    });
    const token = new URLSearchParams(text).get("token") ?? "";
    const nonce = newNonce();
    if (!parts.authorized(token)) {
      parts.log("warn", "fleet page login refused: not the fleet token", {});
      return html(
        loginPage(nonce, "That is not the fleet token: paste this gateway's DORMICE_API_TOKEN"),
        401,
        nonce,
      );
    }
    const id = sessions.open();
    return redirect("/ui", {
      "set-cookie": sessionCookie(id, { secure: secure(c), maxAgeSeconds: sessions.ttlSeconds }),
    });
  });

  app.post("/ui/logout", (c) => {
    sameOrigin(c);
    sessions.close(sessionOf(c.req.raw.headers));
    return redirect("/ui", {
      "set-cookie": sessionCookie(null, { secure: secure(c), maxAgeSeconds: 0 }),
    });
  });

  app.get("/ui/fragments", async (c) => {
    if (!signedIn(c)) {
      return c.json({ message: "The fleet page session ended: log in again at /ui" }, 401);
    }
    const view = await data.view(parseFilters(new URL(c.req.url).searchParams));
    return c.json({ at: view.now, sections: fleetSections(view) }, 200, {
      "cache-control": "no-store",
    });
  });

  app.get("/ui/sandboxes/:id", async (c) => {
    if (!signedIn(c)) return redirect("/ui");
    const nonce = newNonce();
    const id = c.req.param("id");
    let details;
    try {
      details = await data.details(id, c.req.raw.signal);
    } catch (error) {
      if (!(error instanceof HttpError)) throw error;
      return html(
        messagePage(nonce, "Cannot show this sandbox", error.message),
        error.status,
        nonce,
      );
    }
    if (details === null) {
      return html(
        messagePage(nonce, "No such sandbox", `No node of the fleet has a sandbox '${id}'`),
        404,
        nonce,
      );
    }
    return html(detailsPage(details, nonce), 200, nonce);
  });

  app.all("/ui/*", (c) => {
    throw new HttpError(404, `No fleet page route ${c.req.method} ${new URL(c.req.url).pathname}`);
  });
}

/**
 * A form posted from another site is refused: with a SameSite=Strict cookie it could only log
 * someone in or out, but nothing on another origin has a reason to.
 */
function sameOrigin(c: Context): void {
  const origin = c.req.header("origin");
  if (origin === undefined || origin === "null") return;
  const host = c.req.header("host") ?? new URL(c.req.url).host;
  let given: string;
  try {
    given = new URL(origin).host;
  } catch {
    given = "";
  }
  if (given !== host) {
    throw new HttpError(
      403,
      `The fleet page's forms are posted from the page itself, not ${origin}`,
    );
  }
}

function newNonce(): string {
  return btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
}

function html(body: string, status: number, nonce: string): Response {
  return new Response(body, {
    status,
    headers: {
      "content-type": "text/html; charset=utf-8",
      "content-security-policy": `default-src 'none'; style-src 'nonce-${nonce}'; ` +
        `script-src 'nonce-${nonce}'; connect-src 'self'; img-src 'self' data:; form-action 'self'; ` +
        "base-uri 'none'; frame-ancestors 'none'",
      "cache-control": "no-store",
      "x-frame-options": "DENY",
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
    },
  });
}

function redirect(location: string, headers: Record<string, string> = {}): Response {
  return new Response(null, {
    status: 303,
    headers: { location, "cache-control": "no-store", ...headers },
  });
}
