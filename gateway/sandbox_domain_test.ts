import assert from "node:assert/strict";
import { routeByHost } from "./sandbox_domain.ts";

const domain = "sbx.example.com";

Deno.test("routeByHost() reads <port>-<id> for ids of letters and digits and for sbx_ ids", () => {
  assert.deepEqual(routeByHost(`49983-k3v9q0z8m2c4x7w1b5n6.${domain}`, domain), {
    kind: "sandbox",
    sandboxId: "k3v9q0z8m2c4x7w1b5n6",
    port: 49983,
  });
  // An id that starts with a digit: the port is the digits before the first '-'.
  assert.deepEqual(routeByHost(`8000-0abc.${domain}:443`, domain), {
    kind: "sandbox",
    sandboxId: "0abc",
    port: 8000,
  });
  // Ledgers of earlier versions hold sbx_ ids: still routed for clients that reach them.
  assert.deepEqual(routeByHost(`8000-SBX_olf4gmih.${domain}`, domain), {
    kind: "sandbox",
    sandboxId: "sbx_olf4gmih",
    port: 8000,
  });
  assert.deepEqual(routeByHost(`api.${domain}`, domain), { kind: "api" });
});

Deno.test("routeByHost() leaves hosts outside the domain or without a port label alone", () => {
  assert.equal(routeByHost(`8000-abc.other.example.com`, domain), undefined);
  assert.equal(routeByHost(`abc.${domain}`, domain), undefined);
  assert.equal(routeByHost(`70000-abc.${domain}`, domain), undefined);
  assert.equal(routeByHost(`8000-a.b.${domain}`, domain), undefined);
  assert.equal(routeByHost(null, domain), undefined);
});
