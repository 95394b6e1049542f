import assert from "node:assert/strict";
import { gatewayMain, gatewayPermissions } from "./_gateway.ts";
import { freePort, newToken, spawnDeno } from "./_processes.ts";

/** Runs a gateway that must refuse to boot, bounded, and answers its stderr. */
async function refusal(granted: string, env: Record<string, string>): Promise<string> {
  const p = spawnDeno(gatewayMain, {
    env: { DORMICE_API_TOKEN: newToken(), DORMICE_GATEWAY_PORT: String(freePort()), ...env },
    permissions: gatewayPermissions(granted),
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const status = await Promise.race([
    p.exited,
    new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), 15_000)),
  ]);
  clearTimeout(timer);
  if (status === null) {
    await p.stop();
    assert.fail(`the gateway started instead of refusing: ${p.stderr()}`);
  }
  assert.equal(status.code, 2, p.stderr());
  return p.stderr();
}

Deno.test("gateway process: files outside its grant name the flags to run with", async () => {
  const granted = await Deno.makeTempDir();
  const elsewhere = await Deno.makeTempDir();
  try {
    const db = `${elsewhere}/gw/gateway.db`;
    assert.match(
      await refusal(granted, { DORMICE_GATEWAY_DB: db }),
      new RegExp(
        `Cannot open DORMICE_GATEWAY_DB='${db}' .*deno task gateway may write only under ` +
          `\\.dormice; .* --allow-read=${elsewhere}/gw --allow-write=${elsewhere}/gw`,
      ),
    );
    const pem = `${elsewhere}/cert.pem`;
    await Deno.writeTextFile(pem, "not read");
    assert.match(
      await refusal(granted, {
        DORMICE_GATEWAY_DB: `${granted}/gateway.db`,
        DORMICE_GATEWAY_TLS_CERT: pem,
        DORMICE_GATEWAY_TLS_KEY: pem,
      }),
      new RegExp(
        `Cannot read DORMICE_GATEWAY_TLS_CERT='${pem}' .*deno task gateway may read only ` +
          `/etc/dormice and \\.dormice; .* --allow-read=${pem}`,
      ),
    );
  } finally {
    await Deno.remove(granted, { recursive: true });
    await Deno.remove(elsewhere, { recursive: true });
  }
});
