import assert from "node:assert/strict";
import { buildGateway } from "../app.ts";
import { runKeysCommand } from "./cli.ts";

Deno.test("runKeysCommand() creates, lists and revokes keys through the gateway's verbs", async () => {
  const token = "t".repeat(32);
  const gateway = buildGateway({ token });
  const lines: string[] = [];
  const io = {
    gatewayUrl: "http://gw",
    token,
    fetch:
      ((url: string, init: RequestInit) => gateway.fetch(new Request(url, init))) as typeof fetch,
    print: (line: string) => lines.push(line),
  };
  const created = await runKeysCommand(
    ["create", "--team", "dev", "--max-sandboxes", "3"],
    io,
  );
  assert.equal(created, 0, lines.join("\n"));
  const key = /export E2B_API_KEY=(e2b_[0-9a-f]{40})/.exec(lines.join("\n"))?.[1];
  assert.ok(key, lines.join("\n"));
  assert.equal(gateway.keys.verify(key)?.team, "dev");
  const id = gateway.keys.list()[0].id;
  lines.length = 0;
  assert.equal(await runKeysCommand(["list"], io), 0);
  assert.match(lines[0], new RegExp(`^${id}  team dev .*maxSandboxes 3`));
  assert.ok(!lines.join("").includes(key), "list never prints a key");
  assert.equal(await runKeysCommand(["revoke", id], io), 0);
  assert.equal(gateway.keys.verify(key), undefined);
  lines.length = 0;
  assert.equal(await runKeysCommand(["revoke", id], io), 1);
  assert.match(lines[0], /refused revokeApiKey \(404\): No API key with id/);
  lines.length = 0;
  assert.equal(await runKeysCommand(["create", "--team", "x", "--max-sandboxes", "0"], io), 1);
  assert.match(lines[0], /'maxSandboxes': must be at least 1/);
  assert.equal(await runKeysCommand(["create"], io), 2);
  assert.equal(await runKeysCommand(["rotate"], io), 2);
  assert.equal(await runKeysCommand(["list"], { ...io, token: undefined }), 2);
  lines.length = 0;
  assert.equal(await runKeysCommand(["list"], { ...io, token: "u".repeat(32) }), 1);
  assert.match(lines[0], /\(401\): .*DORMICE_API_TOKEN here must be the fleet token the gateway/);
  gateway.close();
});

Deno.test("deno task keys --help prints the usage and succeeds, asking nothing of the gateway", async () => {
  for (const ask of ["--help", "-h", "help"]) {
    const lines: string[] = [];
    const io = {
      gatewayUrl: "http://gw",
      token: undefined,
      fetch: (() => Promise.reject(new Error("no request expected"))) as typeof fetch,
      print: (line: string) => lines.push(line),
    };
    assert.equal(await runKeysCommand([ask], io), 0, ask);
    assert.match(lines.join("\n"), /^Usage:\n {2}deno task keys create --team <team>/, ask);
  }
});
