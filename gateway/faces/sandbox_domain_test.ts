import assert from "node:assert/strict";
import { createDomainFront, routeByHost } from "./sandbox_domain.ts";

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
  assert.equal(routeByHost(`8000-a.b.${domain}`, domain), undefined);
  assert.equal(routeByHost(null, domain), undefined);
});

Deno.test("routeByHost() reads a malformed port label as badPort, never as another port", () => {
  for (
    const label of ["0-abc", "65536-abc", "70000-abc", "abc-def", "08000-abc", "-abc", "8000-"]
  ) {
    const route = routeByHost(`${label}.${domain}`, domain);
    assert.equal(route?.kind, "badPort", label);
  }
  const leading = routeByHost(`08000-abc.${domain}`, domain);
  assert.ok(leading?.kind === "badPort");
  assert.match(leading.reason, /leading zero: write the port as 8000/);
  const zero = routeByHost(`0-abc.${domain}`, domain);
  assert.ok(zero?.kind === "badPort");
  assert.match(zero.reason, /'0' is not a port: use a number from 1 to 65535/);
  // The edges still route.
  assert.equal(routeByHost(`1-abc.${domain}`, domain)?.kind, "sandbox");
  assert.equal(routeByHost(`65535-abc.${domain}`, domain)?.kind, "sandbox");
});

Deno.test("createDomainFront() answers a malformed port label 400 in the proxy's shape, not the native API", async () => {
  const front = createDomainFront({
    domain,
    next: () => Promise.resolve(new Response("native", { status: 200 })),
    port: () => Promise.resolve(new Response("port", { status: 200 })),
  });
  for (const label of ["0-abc", "65536-abc", "abc-def", "08000-abc"]) {
    const res = await front(new Request(`http://${label}.${domain}/`));
    assert.equal(res.status, 400, label);
    const body = await res.json();
    assert.equal(body.code, 400);
    assert.match(
      body.message,
      new RegExp(
        `^The host '${label}\\.${
          domain.replace(".", "\\.")
        }' names no sandbox port: .*<port>-<sandboxId>\\.`,
      ),
    );
  }
  const ok = await front(new Request(`http://8000-abc.${domain}/`));
  assert.equal(await ok.text(), "port");
  const other = await front(new Request(`http://www.${domain}/`));
  assert.equal(await other.text(), "native");
});
