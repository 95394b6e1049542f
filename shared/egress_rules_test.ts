import assert from "node:assert/strict";
import {
  domainMatches,
  egressAllows,
  egressRulesSchema,
  parseEgressEntry,
  parseEgressList,
  parseTransformRules,
  transformPorts,
  transformsFor,
} from "./egress_rules.ts";
import { describeZodError, sandboxSpecSchema } from "./schemas.ts";

Deno.test("parseEgressEntry() reads addresses and CIDRs into canonical CIDRs", () => {
  const cases: [string, string][] = [
    ["8.8.8.8", "8.8.8.8/32"],
    [" 8.8.8.8/32 ", "8.8.8.8/32"],
    ["10.1.2.3/8", "10.0.0.0/8"],
    ["0.0.0.0/0", "0.0.0.0/0"],
    ["255.255.255.255", "255.255.255.255/32"],
    ["172.16.5.4/12", "172.16.0.0/12"],
  ];
  for (const [entry, cidr] of cases) assert.deepEqual(parseEgressEntry(entry), { ok: true, cidr });
});

Deno.test("parseEgressEntry() says what is wrong with each shape it does not serve", () => {
  const cases: [string, RegExp][] = [
    ["localhost", /single-label name/],
    ["8.8.8.8:53", /names a port/],
    ["8.8.8.0/24:1-1024", /names a port/],
    ["2001:db8::/32", /IPv6/],
    ["::1", /IPv6/],
    ["256.1.1.1", /not an IPv4 address/],
    ["01.1.1.1", /leading zeros/],
    ["1.1.1.1/33", /prefix length/],
    ["1.1.1.1/08", /prefix length/],
    ["0.0.0.0", /unspecified address/],
    ["", /not an IPv4 address or CIDR/],
    ["1.2.3", /not an IPv4 address or CIDR/],
    ["a b", /not an IPv4 address or CIDR/],
    ["Bücher.example", /internationalized name: .*'xn--bcher-kva\.example'/],
    ["*.bücher.example", /internationalized name: .*'\*\.xn--bcher-kva\.example'/],
  ];
  for (const [entry, why] of cases) {
    const r = parseEgressEntry(entry);
    assert.equal(r.ok, false, entry);
    if (!r.ok) assert.match(r.why, why, entry);
  }
});

Deno.test("parseEgressList() names the field and index of the first bad entry, and the cap", () => {
  assert.deepEqual(
    parseEgressList(
      ["1.1.1.1", "1.1.1.1/32", "2.2.2.2", "A.example.com.", "*.b.example", "a.example.com"],
      "network.allowOut",
    ),
    {
      ok: true,
      cidrs: ["1.1.1.1/32", "2.2.2.2/32"],
      domains: ["a.example.com", "*.b.example"],
    },
  );
  for (const bad of ["*", "a.*.example", "*example.com", "localhost"]) {
    assert.equal(parseEgressList([bad], "network.allowOut").ok, false, bad);
  }
  const bad = parseEgressList(["1.1.1.1", "1.1.1.300"], "network.denyOut");
  assert.equal(bad.ok, false);
  if (!bad.ok) assert.match(bad.error, /^'network\.denyOut\[1\]' '1\.1\.1\.300' is not an IPv4/);
  const many = parseEgressList(Array.from({ length: 101 }, () => "1.1.1.1"), "network.allowOut");
  assert.equal(many.ok, false);
  if (!many.ok) assert.match(many.error, /'network\.allowOut' has 101 entries, more than the 100/);
});

Deno.test("egressAllows() lets an allow win over any deny, broader or narrower, as E2B does", () => {
  const denyAll = { allowOut: ["198.18.0.1/32"], denyOut: ["0.0.0.0/0"] };
  assert.equal(egressAllows(denyAll, "198.18.0.1"), true);
  assert.equal(egressAllows(denyAll, "198.18.0.2"), false);
  // A narrower deny inside an allowed range is still allowed: allow always takes precedence.
  const narrow = { allowOut: ["198.18.0.0/24"], denyOut: ["198.18.0.7/32"] };
  assert.equal(egressAllows(narrow, "198.18.0.7"), true);
  // Denied without an allow; anything neither list names is allowed.
  const some = { allowOut: [], denyOut: ["10.0.0.0/8"] };
  assert.equal(egressAllows(some, "10.9.9.9"), false);
  assert.equal(egressAllows(some, "11.0.0.1"), true);
  assert.equal(egressAllows({ allowOut: [], denyOut: [] }, "1.1.1.1"), true);
});

Deno.test("sandboxSpecSchema reads spec.egressRules, a bad entry named by its path", () => {
  const ok = sandboxSpecSchema.parse({ egressRules: { allowOut: ["1.1.1.1"] } });
  assert.deepEqual(ok.egressRules, { allowOut: ["1.1.1.1/32"], denyOut: [] });
  const named = sandboxSpecSchema.parse({
    egressRules: {
      allowOut: ["a.example"],
      denyOut: ["0.0.0.0/0"],
      transforms: { "a.example": [{ headers: { "X-K": "v" } }] },
    },
  });
  assert.deepEqual(named.egressRules, {
    allowOut: [],
    denyOut: ["0.0.0.0/0"],
    allowDomains: ["a.example"],
    transforms: { "a.example": [{ headers: { "X-K": "v" } }] },
  });
  // The stored form reads back as itself.
  assert.deepEqual(sandboxSpecSchema.parse(named).egressRules, named.egressRules);
  const r = sandboxSpecSchema.safeParse({ egressRules: { denyOut: ["0.0.0.0/0", "localhost"] } });
  assert.equal(r.success, false);
  if (!r.success) {
    assert.match(describeZodError(r.error), /^'egressRules\.denyOut\.1': 'localhost' is a single/);
  }
  assert.equal(egressRulesSchema.safeParse({ allowOut: ["1.1.1.1"], extra: 1 }).success, false);
});

Deno.test("domainMatches() and transformsFor(): exact first, then the longest wildcard, never the apex", () => {
  assert.equal(domainMatches("*.example.com", "a.b.example.com"), true);
  assert.equal(domainMatches("*.example.com", "example.com"), false);
  assert.equal(domainMatches("*.example.com", "badexample.com"), false);
  const t = {
    "api.example.com": [{ headers: { a: "exact" } }],
    "*.example.com": [{ headers: { a: "short" } }],
    "*.api.example.com": [{ headers: { a: "long" } }],
  };
  assert.deepEqual(transformsFor(t, "api.example.com"), [{ headers: { a: "exact" } }]);
  assert.deepEqual(transformsFor(t, "v1.api.example.com"), [{ headers: { a: "long" } }]);
  assert.deepEqual(transformsFor(t, "www.example.com"), [{ headers: { a: "short" } }]);
  assert.equal(transformsFor(t, "example.com"), undefined);
});

Deno.test("transformsFor() with a port: a key with a port applies to it only, one without to any", () => {
  const t = {
    "api.example.com": [{ headers: { a: "any port" } }],
    "api.example.com:8443": [{ headers: { a: "8443" } }],
    "*.example.com:9443": [{ headers: { a: "wild 9443" } }],
    "*.example.com": [{ headers: { a: "wild" } }],
    "gw.test:21200": [{ headers: { a: "gateway" } }],
  };
  assert.deepEqual(transformsFor(t, "api.example.com", 8443), [{ headers: { a: "8443" } }]);
  assert.deepEqual(transformsFor(t, "api.example.com", 443), [{ headers: { a: "any port" } }]);
  assert.deepEqual(transformsFor(t, "api.example.com", 9443), [{ headers: { a: "any port" } }]);
  // Wildcards of the same length: the one with the port wins on its port.
  assert.deepEqual(transformsFor(t, "www.example.com", 9443), [{ headers: { a: "wild 9443" } }]);
  assert.deepEqual(transformsFor(t, "www.example.com", 443), [{ headers: { a: "wild" } }]);
  assert.deepEqual(transformsFor(t, "gw.test", 21200), [{ headers: { a: "gateway" } }]);
  assert.equal(transformsFor(t, "gw.test", 443), undefined);
  assert.deepEqual(transformPorts(t), [8443, 9443, 21200]);
});

Deno.test("parseTransformRules() takes a key with a port, as a sandbox's own host:port is", () => {
  const r = parseTransformRules({
    "8080-abc.Dormice.test:21200": [{ transform: { headers: { "X-Test-Token": "v" } } }],
    "*.example.com:443": [],
    "api.example.com": [],
  }, "network.rules");
  assert.deepEqual(r, {
    ok: true,
    transforms: {
      "8080-abc.dormice.test:21200": [{ headers: { "X-Test-Token": "v" } }],
      "*.example.com:443": [],
      "api.example.com": [],
    },
  });
  const cases: [string, RegExp][] = [
    ["a.test:0", /port of a rule's key must be 1-65535/],
    ["a.test:65536", /port of a rule's key must be 1-65535/],
    ["a.test:0443", /without leading zeros/],
    ["a.test:80", /port 80 is plain HTTP/],
    ["1.2.3.4:443", /a rule's key must be a domain name/],
    ["bücher.example:443", /a rule's key must be a domain name/],
    ["*:443", /a rule's key must be a domain name/],
    ["a.*.test:443", /a rule's key must be a domain name/],
    ["localhost:8443", /a rule's key must be a domain name/],
    ["a.test:", /a rule's key must be a domain name/],
  ];
  for (const [key, pattern] of cases) {
    const bad = parseTransformRules({ [key]: [] }, "network.rules");
    assert.equal(bad.ok, false, key);
    if (!bad.ok) assert.match(bad.error, pattern, key);
  }
  const many = Object.fromEntries(
    Array.from({ length: 9 }, (_, i) => [`a.test:${9000 + i}`, []]),
  );
  const tooMany = parseTransformRules(many, "network.rules");
  assert.equal(tooMany.ok, false);
  if (!tooMany.ok) assert.match(tooMany.error, /more than 8 ports other than 443/);
});

Deno.test("parseTransformRules() reads E2B's rules and names what is wrong, never a value", () => {
  assert.deepEqual(
    parseTransformRules({ "API.Example.com": [{ transform: { headers: { "X-Key": "k" } } }] }, "r"),
    { ok: true, transforms: { "api.example.com": [{ headers: { "X-Key": "k" } }] } },
  );
  const cases: [unknown, RegExp][] = [
    [[], /'r' must be an object/],
    [{ "1.2.3.4": [] }, /'r\.1\.2\.3\.4': a rule's key must be a domain/],
    [{ "a.test": {} }, /'r\.a\.test' must be a list/],
    [
      { "a.test": [{ transform: { body: "x" } }] },
      /'r\.a\.test\[0\]\.transform\.body' is not served/,
    ],
    [{ "a.test": [{ transform: { headers: { Host: "x" } } }] }, /names 'Host'/],
    [{ "a.test": [{ transform: { headers: { "a b": "x" } } }] }, /names 'a b'/],
    [{ "a.test": [{ transform: { headers: { a: "secret\r\nx: y" } } }] }, /single-line/],
  ];
  for (const [value, pattern] of cases) {
    const r = parseTransformRules(value, "r");
    assert.equal(r.ok, false, JSON.stringify(value));
    if (!r.ok) {
      assert.match(r.error, pattern);
      assert.ok(!r.error.includes("secret"), r.error);
    }
  }
});
