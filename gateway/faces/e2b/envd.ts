/**
 * The gateway's envd routing: `/e2b/envd` (the sandbox named by `E2b-Sandbox-Id`, its
 * credentials checked at the door, then found by id and streamed both ways, or another of its
 * ports reached through `E2b-Sandbox-Port`) and the SDK's root signed `/files` door. Errors are
 * Connect's on RPC paths and E2B's elsewhere. Kept apart from the control plane
 * (`control.ts`): these requests carry the sandbox's own token, not an API key, and are
 * never captured, only streamed.
 *
 * @module
 */
import { type ConnectCode, statusToConnectCode } from "../../../shared/connect_codes.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { optionalE2bCaller, scopeOf } from "../../keys/auth.ts";
import type { GatewayParts } from "../parts.ts";
import {
  checkedId,
  e2bError,
  httpErrorOrBug,
  locate,
  requireCredentials,
  SANDBOX_ID_HEADER,
  suffix,
} from "./door.ts";
import { createPortProxy, type PortProxy } from "../ports.ts";
import { ENVD_PORT } from "../sandbox_domain.ts";
import { HttpError } from "../../../shared/http_error.ts";

/** The header the SDK names the port with; other than envd's, it reaches that sandbox port. */
const SANDBOX_PORT_HEADER = "e2b-sandbox-port";

/**
 * envd over the gateway's parts; `nodeEnvd` is where each node serves its own.
 *
 * @example
 * ```ts ignore
 * app.route("/e2b/envd", createE2bEnvd(parts, "/e2b/envd"));
 * ```
 */
export function createE2bEnvd(parts: GatewayParts, nodeEnvd: string): Hono {
  const ports = createPortProxy(parts);
  const app = new Hono();
  app.all("*", async (c) => {
    const rest = suffix(c);
    const port = c.req.header(SANDBOX_PORT_HEADER);
    if (port !== undefined && port !== String(ENVD_PORT)) {
      return await portByHeader(c.req.raw, c.req.header(SANDBOX_ID_HEADER), port, rest, ports);
    }
    const dialect = isRpc(rest) ? "connect" : "rest";
    try {
      const header = c.req.header(SANDBOX_ID_HEADER);
      if (!header) {
        throw new HttpError(
          400,
          "The E2b-Sandbox-Id header is missing: name the sandbox the request is for",
        );
      }
      const id = checkedId(header);
      requireCredentials(parts, id, c.req.raw, dialect === "rest");
      const signal = c.req.raw.signal;
      // The SDK sends envd no API key (the sandbox's access token guards it); a request that
      // does send one sees its own team's sandboxes only, another team's as absent.
      const caller = optionalE2bCaller(c.req.raw.headers, parts.identify);
      const team = caller === undefined ? undefined : scopeOf(caller);
      const r = await parts.routing.resolve("id", id, signal, team);
      if (r.kind === "none") {
        // E2B's own proxy answers 502 for a sandbox that is not running; the SDK reads it (and
        // Connect's `unavailable`) as "the sandbox is gone or timed out".
        throw new HttpError(
          502,
          `No sandbox '${id}' on any node of the fleet: it was killed or timed out`,
        );
      }
      const path = `${nodeEnvd}${rest}${new URL(c.req.url).search}`;
      // No header is replaced: `Authorization: Basic` names the run-as user and `X-Access-Token`
      // is verified by the node, so both pass through untouched.
      return await parts.routing.stream(c.req.raw, {
        found: r,
        by: "id",
        key: id,
        path,
        headers: {},
      });
    } catch (error) {
      return dialect === "connect"
        ? connectError(error, c.req.raw, parts)
        : e2bError(error, c.req.raw, parts);
    }
  });
  return app;
}

/** `E2b-Sandbox-Port` other than envd's: that port of that sandbox, as by Host. */
function portByHeader(
  request: Request,
  id: string | undefined,
  port: string,
  rest: string,
  ports: PortProxy,
): Promise<Response> {
  const n = Number(port);
  if (!/^\d{1,5}$/.test(port) || n < 1 || n > 65535) {
    return Promise.resolve(Response.json({
      code: 400,
      message: `E2b-Sandbox-Port must be a port from 1 to 65535: received '${port.slice(0, 20)}'`,
    }, { status: 400 }));
  }
  if (!id) {
    return Promise.resolve(Response.json({
      code: 400,
      message: "The E2b-Sandbox-Id header is missing: name the sandbox the request is for",
    }, { status: 400 }));
  }
  return ports(request, id, n, rest + new URL(request.url).search);
}

/** Connect RPC paths look like `/process.Process/Start`; everything else is envd's REST. */
function isRpc(path: string): boolean {
  return /^\/[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)+\/[A-Za-z0-9_]+$/.test(path);
}

/**
 * Connect codes for the statuses routing raises. A 409 here is the same sandbox on two nodes,
 * which the client cannot fix by retrying with other input: `aborted`, not `already_exists`.
 */
function connectCodeOf(status: number): ConnectCode {
  return status === 409 ? "aborted" : statusToConnectCode(status);
}

function connectError(error: unknown, request: Request, parts: GatewayParts): Response {
  const e = httpErrorOrBug(error, request, parts);
  return Response.json({ code: connectCodeOf(e.status), message: e.message }, {
    status: e.status,
    headers: e.headers,
  });
}

/**
 * The SDK's bare signed `/files` door at the root; `nodeEnvd` is where each node serves envd.
 *
 * @example
 * ```ts ignore
 * app.route("/", createFilesDoor(parts, "/e2b/envd"));
 * ```
 */
export function createFilesDoor(parts: GatewayParts, nodeEnvd: string): Hono {
  const app = new Hono();
  const serve = async (c: Context): Promise<Response> => {
    try {
      const id = c.req.header(SANDBOX_ID_HEADER);
      if (!id) {
        throw new HttpError(
          501,
          "The gateway cannot route a bare signed /files URL: the signature does not name the " +
            "sandbox. Build signed URLs against the node's own address (sandboxUrl " +
            "http://<node>/e2b/envd; the gateway's listNodes names each node's address), or read and write " +
            "through the sandbox (files.read / files.write), which the gateway routes",
        );
      }
      requireCredentials(parts, checkedId(id), c.req.raw, true);
      const caller = optionalE2bCaller(c.req.raw.headers, parts.identify);
      const team = caller === undefined ? undefined : scopeOf(caller);
      const found = await locate(parts, id, c.req.raw.signal, team);
      const path = `${nodeEnvd}/files${new URL(c.req.url).search}`;
      return await parts.routing.stream(c.req.raw, { found, by: "id", key: id, path, headers: {} });
    } catch (error) {
      return e2bError(error, c.req.raw, parts);
    }
  };
  app.get("/files", serve);
  app.post("/files", serve);
  app.all("/files", (c) =>
    e2bError(
      new HttpError(405, `${c.req.method} is not allowed on /files: use GET or POST`, {
        headers: { allow: "GET, POST" },
      }),
      c.req.raw,
      parts,
    ));
  return app;
}
