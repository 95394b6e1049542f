import assert from "node:assert/strict";
import { asksForEgressRules } from "../../shared/egress_rules.ts";
import { parseCreateOptions } from "./e2b_create_options.ts";

Deno.test("parseCreateOptions(): without allowInternetAccess, egress follows defaultEgress; a stated value wins", () => {
  const network = (body: object, defaultEgress?: boolean) =>
    parseCreateOptions(body, 60, { defaultEgress }).spec.network;
  assert.equal(network({}), undefined);
  assert.equal(network({}, false), undefined);
  assert.equal(network({}, true), true);
  assert.equal(network({ network: { allowPublicTraffic: false } }, true), true);
  for (const defaultEgress of [false, true]) {
    assert.equal(network({ allowInternetAccess: true }, defaultEgress), true);
    assert.equal(network({ allow_internet_access: true }, defaultEgress), true);
    assert.equal(network({ allowInternetAccess: false }, defaultEgress), undefined);
    // A deny of every address alone is no egress, and not a contradiction with the default.
    assert.equal(network({ network: { denyOut: ["0.0.0.0/0"] } }, defaultEgress), undefined);
  }
  // The ledger keeps what the create said: nothing, whatever the default gave it.
  assert.equal(
    parseCreateOptions({}, 60, { defaultEgress: true }).e2b.allowInternetAccess,
    undefined,
  );
});

Deno.test("parseCreateOptions(): the default never changes which creates need egress rules, so placement (asksForEgressRules) still funnels them", () => {
  const bodies: Record<string, unknown>[] = [
    {},
    { allowInternetAccess: true },
    { allowInternetAccess: false },
    { network: { denyOut: ["8.8.8.8"] } },
    { network: { allowOut: ["1.1.1.1"] } },
    { network: { denyOut: ["0.0.0.0/0"] } },
    { network: { denyOut: ["0.0.0.0/0"], allowOut: ["1.1.1.1"] } },
    { allowInternetAccess: false, network: { allowOut: ["1.1.1.1"] } },
    { network: { allowOut: ["api.example.com"] } },
    { network: { rules: { "api.example.com": [{ transform: { headers: { "X-K": "v" } } }] } } },
    { network: { allowPublicTraffic: false } },
  ];
  for (const body of bodies) {
    const off = parseCreateOptions(body, 60, { defaultEgress: false }).spec;
    const on = parseCreateOptions(body, 60, { defaultEgress: true }).spec;
    const label = JSON.stringify(body);
    assert.deepEqual(on.egressRules, off.egressRules, label);
    assert.equal(on.egressRules !== undefined, asksForEgressRules(body), label);
  }
  // The SDK's "deny specific IP address" shape: egress on (default or not) with a deny, placed
  // only where rules are enforced.
  const deny = parseCreateOptions({ network: { denyOut: ["8.8.8.8"] } }, 60, {
    defaultEgress: true,
  }).spec;
  assert.deepEqual(deny, { network: true, egressRules: { allowOut: [], denyOut: ["8.8.8.8/32"] } });
});
