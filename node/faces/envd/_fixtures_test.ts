/**
 * The envd tests' fixture: one sandbox on a fake executor behind `createEnvd` at `/e2b/envd`
 * and the signed `/files` door at the root, with helpers for unary and streamed calls.
 */
import { Hono } from "hono";
import { AccessTokens } from "../../../shared/access_tokens.ts";
import { encodeEnvelope } from "../connect_codec.ts";
import { FakeExecutor } from "../../executors/fake.ts";
import { Ledger } from "../../ledger.ts";
import { SandboxService } from "../../service.ts";
import { createEnvd, type EnvdOptions, handleSignedFiles } from "./mod.ts";

/** Builds the fixture; close `executor` at the end of the test. */
export async function setup(options: Omit<EnvdOptions, "accessTokens"> = {}) {
  const executor = new FakeExecutor();
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const service = new SandboxService({ ledger, executor });
  const accessTokens = new AccessTokens("secret for the envd tests 0123456789abc");
  const app = new Hono();
  app.route("/e2b/envd", createEnvd(service, { accessTokens, ...options }));
  app.route("/", handleSignedFiles(service, { accessTokens, ...options }));
  const { sandbox } = await service.acquire({ name: "envd-1" });
  const headers = (extra: Record<string, string> = {}) => ({
    "E2b-Sandbox-Id": sandbox.id,
    "X-Access-Token": accessTokens.forSandbox(sandbox.id),
    ...extra,
  });
  const unary = (method: string, body: unknown, h = headers()) =>
    app.request(`/e2b/envd/${method}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...h },
      body: JSON.stringify(body),
    });
  const stream = (method: string, body: unknown, h = headers(), signal?: AbortSignal) =>
    app.request(`/e2b/envd/${method}`, {
      method: "POST",
      headers: { "content-type": "application/connect+json", ...h },
      body: encodeEnvelope(0, body),
      signal,
    });
  return { app, service, executor, accessTokens, sandbox, headers, unary, stream };
}
