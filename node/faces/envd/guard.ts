/**
 * The door every header-routed envd request passes: the sandbox is the one the
 * `E2b-Sandbox-Id` header names, and when the node gives sandboxes access tokens the request
 * carries that sandbox's `X-Access-Token` (or, on `/files`, a valid signed URL).
 *
 * @module
 */
import type { Context } from "hono";
import type { SandboxRecord } from "../../service_contract.ts";
import { envdRefusal, envdRequestAuthorized } from "../../../shared/access_tokens.ts";
import { ConnectError, connectErrorResponse } from "../connect_codec.ts";
import { type EnvdCore, SANDBOX_HEADER } from "./core.ts";
import { restErrorOf, toConnect } from "./dialects.ts";

/**
 * Picks the sandbox, checks its token, runs `fn`, and answers whatever `fn` (or the checks)
 * threw in `dialect`: Connect `{code:"…"}` for RPCs, REST `{code:<int>}` for `/files`.
 *
 * @example
 * ```ts ignore
 * app.get("/files", (c) => guard(core, c, "rest", (sandbox) => readFileResponse(core, sandbox, url)));
 * ```
 */
export async function guard(
  core: EnvdCore,
  c: Context,
  dialect: "rest" | "connect",
  fn: (sandbox: SandboxRecord) => Promise<Response>,
): Promise<Response> {
  try {
    const id = c.req.header(SANDBOX_HEADER);
    if (!id) {
      throw new ConnectError(
        "invalid_argument",
        `The ${SANDBOX_HEADER} header is missing: name the sandbox the request is for`,
      );
    }
    const sandbox = core.ops.get({ id });
    if (!sandbox) {
      throw new ConnectError(
        "unavailable",
        `No sandbox '${id}' on this node: it may have been killed`,
      );
    }
    const tokens = core.options.accessTokens;
    if (tokens) {
      // A signed URL reaching envd through the gateway (with the sandbox header) also counts.
      const credentials = {
        accessToken: c.req.header("X-Access-Token"),
        url: new URL(c.req.url),
        method: c.req.method,
        signedUrlAllowed: dialect === "rest",
      };
      const now = core.options.clock.now();
      if (!envdRequestAuthorized(tokens, sandbox.id, credentials, now)) {
        throw new ConnectError(
          "unauthenticated",
          envdRefusal(tokens, sandbox.id, credentials, now),
        );
      }
    }
    return await fn(await admitTraffic(core, sandbox));
  } catch (error) {
    if (dialect === "connect") {
      const { code, message } = toConnect(core.options.log, error);
      return connectErrorResponse(code, message);
    }
    return restErrorOf(core.options.log, error);
  }
}

/**
 * Lets traffic reach a sandbox: a running one as it is, a paused one resumed when its lifecycle
 * allows (`autoResume`; a native sandbox wakes on use), else refused as E2B refuses traffic to
 * a paused sandbox: `unavailable`, which the SDK reads as "not running".
 *
 * @throws {ConnectError} `unavailable` when the sandbox is paused and does not auto-resume.
 * @example
 * ```ts ignore
 * const awake = await admitTraffic(core, sandbox);
 * ```
 */
export async function admitTraffic(
  core: EnvdCore,
  sandbox: SandboxRecord,
): Promise<SandboxRecord> {
  if (sandbox.state === "active" || sandbox.state === "restoring") return sandbox;
  const awake = await core.ops.wakeForTraffic({ id: sandbox.id });
  if (awake) return awake;
  throw new ConnectError(
    "unavailable",
    `Sandbox '${sandbox.id}' is paused: resume it with Sandbox.connect(), or create it with ` +
      "lifecycle.autoResume so that traffic resumes it",
  );
}
