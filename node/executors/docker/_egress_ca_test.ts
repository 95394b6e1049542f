import assert from "node:assert/strict";
import { EgressCa } from "./_egress_ca.ts";

const hasOpenssl = await new Deno.Command("openssl", { args: ["version"], stdout: "null" })
  .output().then((o) => o.success, () => false);
if (!hasOpenssl) console.log("egress CA test skipped: openssl is not installed");

Deno.test({
  name: "EgressCa.load() makes a CA once in the data dir; leaf() signs a certificate for a name",
  ignore: !hasOpenssl,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "egress-ca-test-" });
  try {
    const ca = await EgressCa.load(null, dir);
    assert.match(ca.certPem, /^-----BEGIN CERTIFICATE-----/);
    assert.equal((await Deno.stat(`${dir}/egress-ca.key`)).mode! & 0o777, 0o600);
    // The same CA on the next boot: sandboxes made before still trust it.
    const again = await EgressCa.load(null, dir);
    assert.equal(again.fingerprint, ca.fingerprint);
    const leaf = await ca.leaf("api.example.com");
    assert.equal(await ca.leaf("api.example.com"), leaf, "kept, not signed again");
    await Deno.writeTextFile(`${dir}/leaf.pem`, leaf.cert.split(ca.certPem)[0]);
    const verify = await new Deno.Command("openssl", {
      args: [
        "verify",
        "-CAfile",
        `${dir}/egress-ca.crt`,
        "-verify_hostname",
        "api.example.com",
        `${dir}/leaf.pem`,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(verify.success, new TextDecoder().decode(verify.stderr));
    // Nothing left of the signing in the data dir.
    const left = [];
    for await (const e of Deno.readDir(dir)) left.push(e.name);
    assert.deepEqual(left.sort(), ["egress-ca.crt", "egress-ca.key", "leaf.pem"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("EgressCa.load() refuses configured files it cannot read, naming the settings", async () => {
  await assert.rejects(
    () =>
      EgressCa.load({ certFile: "/nonexistent/ca.crt", keyFile: "/nonexistent/ca.key" }, "/tmp"),
    /egress CA cannot be read .*DORMICE_EGRESS_CA_CERT and DORMICE_EGRESS_CA_KEY/,
  );
});
