/**
 * The gateway's hop to a sandbox port: the sandbox is found by id as envd's are, and the request
 * goes to its node's `/e2b/ports/<port>/<path>` door, which connects inside the sandbox. HTTP is
 * streamed both ways (`forward`), a WebSocket is relayed over a second socket to the node. Errors
 * take the shape of E2B's proxy: `{message, sandboxId, code}`.
 *
 * @module
 */
import { forward, unreachable } from "../routing/forward.ts";
import type { GatewayParts } from "./parts.ts";
import { HttpError } from "../../shared/http_error.ts";
import {
  endToEndHeaders,
  isWebSocketUpgrade,
  RelayOpenError,
  relayWebSocket,
} from "../../shared/port_proxy.ts";

/** Serves one request for `port` of sandbox `sandboxId`; `rest` is the path and query there. */
export type PortProxy = (
  request: Request,
  sandboxId: string,
  port: number,
  rest: string,
) => Promise<Response>;

/**
 * Builds the port hop over the gateway's routing. A sandbox no node holds is a 502
 * `{"message":"The sandbox was not found","sandboxId":"…","code":502}`; the node answers the rest
 * (nothing listening, paused, the traffic token) in the same shape.
 *
 * @example
 * ```ts
 * import { buildGateway } from "../app.ts";
 * import { createPortProxy } from "./ports.ts";
 * const gateway = buildGateway({ token: "t".repeat(32) });
 * const proxy = createPortProxy(gateway);
 * const res = await proxy(new Request("http://gw/"), "sbx_none", 8000, "/");
 * console.log(res.status); // 502
 * await res.body?.cancel();
 * gateway.close();
 * ```
 */
export function createPortProxy(parts: GatewayParts): PortProxy {
  const { routing, log } = parts;
  return async (request, sandboxId, port, rest) => {
    try {
      const found = await routing.resolve("id", sandboxId, request.signal);
      if (found.kind === "none") {
        throw new HttpError(502, "The sandbox was not found");
      }
      const path = `/e2b/ports/${port}${rest.startsWith("/") ? rest : `/${rest}`}`;
      const own = {
        "e2b-sandbox-id": sandboxId,
        "x-forwarded-host": request.headers.get("host") ?? new URL(request.url).host,
      };
      if (isWebSocketUpgrade(request)) {
        const endpoint = found.node.endpoint.replace(/^http/, "ws");
        try {
          return await relayWebSocket(request, endpoint + path, {
            headers: endToEndHeaders(request.headers, own),
          });
        } catch (error) {
          if (!(error instanceof RelayOpenError)) throw error;
          // The node answers a refused port with an HTTP 502 before any upgrade; the client's
          // WebSocket sees a failed handshake either way, so the cause is logged here.
          throw new HttpError(
            502,
            `The WebSocket to port ${port} could not be opened through node ` +
              `'${found.node.id}' (${error.message}): check that a server listens on that port`,
            { details: { port } },
          );
        }
      }
      return await forward(request, { nodeId: found.node.id, endpoint: found.node.endpoint }, {
        path,
        headers: own,
        fetch: routing.nodeFetch,
        hangUps: routing.hangUps,
      });
    } catch (error) {
      return portError(error, request, sandboxId, log);
    }
  };
}

function portError(
  error: unknown,
  request: Request,
  sandboxId: string,
  log: GatewayParts["log"],
): Response {
  let e: HttpError;
  if (error instanceof HttpError) e = error;
  else if (request.signal.aborted) e = new HttpError(499, "The client closed the request");
  else {
    log("error", "unexpected error on a sandbox port route", { error: String(error) });
    e = unreachable({ nodeId: "?", endpoint: "?" }, error);
  }
  return Response.json({ ...e.details, message: e.message, sandboxId, code: e.status }, {
    status: e.status,
    headers: e.headers,
  });
}
