/**
 * The code interpreter's half of the sandbox-domain exam (tests/docker_domain_test.ts), run as
 * its own Deno process for the same reasons as `_domain_sdk.ts`: the unmodified
 * `@e2b/code-interpreter`, configured by the environment alone (`domain` mode: `E2B_DOMAIN` and
 * a key, port 49999 reached at `https://49999-<id>.<domain>`; `header` mode: `E2B_API_URL`,
 * `E2B_SANDBOX_URL` and the `E2b-Sandbox-Port` header). Reads `DORMICE_EXAM_MODE` and
 * `DORMICE_EXAM_HOSTS` as `_domain_sdk.ts` does. Prints `ok <step> (<ms> ms)` per step.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "@e2b/code-interpreter";

const mode = Deno.env.get("DORMICE_EXAM_MODE") === "header" ? "header" : "domain";
const hostsHelper = Deno.env.get("DORMICE_EXAM_HOSTS") ?? "";
const domain = Deno.env.get("E2B_DOMAIN") ?? "";

async function step(name: string, fn: () => Promise<void>): Promise<void> {
  const start = performance.now();
  await fn();
  console.log(`ok ${name} (${Math.round(performance.now() - start)} ms)`);
}

let sandbox!: Sandbox;
await step(
  "Sandbox.create() gives a code-interpreter-v1 sandbox without public traffic",
  async () => {
    // Its ports then require its traffic token, which runCode sends.
    sandbox = await Sandbox.create({ network: { allowPublicTraffic: false } });
    if (mode === "domain") {
      const names = [49983, 49999].map((p) => `${p}-${sandbox.sandboxId}.${domain}`);
      const res = await fetch(hostsHelper, { method: "POST", body: JSON.stringify(names) });
      assert.equal(res.status, 204, await res.text());
    }
  },
);
try {
  await step(`runCode through port 49999 (${mode} mode): x = 40, then x + 2`, async () => {
    await sandbox.runCode("x = 40");
    const run = await sandbox.runCode("x + 2");
    assert.equal(run.error, undefined);
    assert.equal(run.text, "42");
  });
  await step(
    "port 49999 refuses a request without the sandbox's traffic token",
    async () => {
      const token = sandbox.trafficAccessToken;
      assert.ok(token, "a sandbox without public traffic has a traffic token");
      const url = mode === "domain"
        ? `https://${sandbox.getHost(49999)}/contexts`
        : `${Deno.env.get("E2B_SANDBOX_URL")}/contexts`;
      const headers = { "E2b-Sandbox-Id": sandbox.sandboxId, "E2b-Sandbox-Port": "49999" };
      const refused = await fetch(url, { headers });
      await refused.body?.cancel();
      assert.ok([401, 403].includes(refused.status), `status ${refused.status}`);
      const allowed = await fetch(url, {
        headers: { ...headers, "E2B-Traffic-Access-Token": token },
      });
      assert.equal(allowed.status, 200, await allowed.clone().text());
      assert.ok(Array.isArray(await allowed.json()));
    },
  );
} finally {
  await sandbox.kill();
}
