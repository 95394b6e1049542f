import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { FakeClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import { API_KEY_PATTERN, ApiKeys, type CreateApiKeyInput, hashApiKey } from "./keys.ts";

/**
 * The E2B Python SDK's key rule, as `validate_api_key` in e2b/api/__init__.py writes it
 * (`re.compile(r"\Ae2b_[0-9a-f]+\Z")`): the SDK refuses any other key before it sends a request.
 */
const pythonSdkKeyRule = /^e2b_[0-9a-f]+$/;

Deno.test("ApiKeys.create() mints keys the E2B Python SDK's own rule accepts", () => {
  const keys = new ApiKeys();
  for (let i = 0; i < 50; i++) {
    const { key } = keys.create({ team: "t" });
    assert.match(key, pythonSdkKeyRule);
    assert.match(key, API_KEY_PATTERN);
    assert.equal(key.length, 44, "e2b_ and 40 hex digits: 160 random bits");
  }
  // The rule itself: what the Python SDK refuses, the pattern refuses too.
  for (const bad of ["E2B_" + "0".repeat(40), "e2b_" + "A".repeat(40), "t".repeat(44), "e2b_"]) {
    assert.equal(pythonSdkKeyRule.test(bad) && API_KEY_PATTERN.test(bad), false, bad);
  }
  keys.close();
});

Deno.test("ApiKeys stores only hashes, and a reopened table still knows its keys", () => {
  const db = new DatabaseSync(":memory:");
  const clock = new FakeClock(1_700_000_000_000);
  const first = new ApiKeys({ database: db, clock });
  const minted = first.create({ team: "acme", label: "ci", maxSandboxes: 3 });
  const rows = db.prepare("SELECT * FROM gateway_api_keys").all();
  assert.equal(JSON.stringify(rows).includes(minted.key), false);
  assert.equal((rows[0] as { hash: string }).hash, hashApiKey(minted.key));
  const again = new ApiKeys({ database: db, clock });
  assert.equal(again.verify(minted.key)?.id, minted.id);
  assert.deepEqual(again.list(), [{
    id: minted.id,
    team: "acme",
    label: "ci",
    maxSandboxes: 3,
    createsPerMinute: null,
    createdAt: "2023-11-14T22:13:20.000Z",
    lastUsedAt: "2023-11-14T22:13:20.000Z",
  }]);
  db.close();
});

Deno.test("ApiKeys.revoke() refuses the key at once; an unknown id is a 404 sentence", () => {
  const keys = new ApiKeys();
  const minted = keys.create({ team: "acme" });
  keys.revoke(minted.id);
  assert.equal(keys.verify(minted.key), undefined);
  assert.throws(
    () => keys.revoke(minted.id),
    (e) => e instanceof HttpError && e.status === 404 && /listApiKeys/.test(e.message),
  );
  keys.close();
});

Deno.test("ApiKeys.create() answers bad input with a 400 naming the field", () => {
  const keys = new ApiKeys();
  const cases: [unknown, RegExp][] = [
    [{}, /'team' is required/],
    [{ team: "" }, /'team'/],
    [{ team: "x", maxSandboxes: -1 }, /'maxSandboxes': must be at least 1/],
    [{ team: "x", createsPerMinute: 2.5 }, /'createsPerMinute': must be a whole number/],
    [{ team: "x", label: "l".repeat(201) }, /'label'/],
  ];
  for (const [input, pattern] of cases) {
    assert.throws(
      () => keys.create(input as CreateApiKeyInput),
      (e) => e instanceof HttpError && e.status === 400 && pattern.test(e.message),
      JSON.stringify(input),
    );
  }
  keys.close();
});

Deno.test("ApiKeys.verify() records use at most once a minute", () => {
  const clock = new FakeClock(1_700_000_000_000);
  const keys = new ApiKeys({ clock });
  const { key } = keys.create({ team: "t" });
  keys.verify(key);
  clock.tick(30_000);
  assert.equal(keys.verify(key)?.lastUsedAt, "2023-11-14T22:13:20.000Z");
  clock.tick(30_000);
  assert.equal(keys.verify(key)?.lastUsedAt, "2023-11-14T22:14:20.000Z");
  assert.equal(keys.verify("t".repeat(44)), undefined);
  keys.close();
});

Deno.test("ApiKeys.verify(): a key verified lately is still compared whole, and a revoke or forget ends it at once", () => {
  const keys = new ApiKeys();
  try {
    const a = keys.create({ team: "a" });
    const b = keys.create({ team: "b" });
    assert.equal(keys.verify(a.key)?.team, "a");
    assert.equal(keys.verify(a.key)?.team, "a", "again, remembered");
    assert.equal(keys.verify(b.key)?.team, "b");
    const off = a.key.slice(0, -1) + (a.key.endsWith("0") ? "1" : "0");
    assert.equal(keys.verify(off), undefined, "one digit off a remembered key");
    keys.revoke(a.id);
    assert.equal(keys.verify(a.key), undefined, "revoked, though remembered");
    keys.forget(b.id);
    assert.equal(keys.verify(b.key), undefined, "forgotten (another gateway revoked it)");
  } finally {
    keys.close();
  }
});

Deno.test("ApiKeys.verify(): two keys that share a remembered slot are each compared whole", () => {
  const keys = new ApiKeys({ slotOf: () => 7 });
  try {
    const a = keys.create({ team: "a" });
    const b = keys.create({ team: "b" });
    const stranger = "e2b_" + "0".repeat(40);
    assert.equal(keys.verify(a.key)?.team, "a");
    assert.equal(keys.verify(stranger), undefined, "the slot's key is not the stranger's");
    assert.equal(keys.verify(b.key)?.team, "b", "b takes the slot");
    assert.equal(keys.verify(a.key)?.team, "a", "and a is hashed again");
  } finally {
    keys.close();
  }
});

Deno.test("ApiKeys.create() takes a typed CreateApiKeyInput and refuses a bad one in the library's words", () => {
  const keys = new ApiKeys();
  try {
    const input: CreateApiKeyInput = { team: "acme", label: "ci", maxSandboxes: 5 };
    assert.equal(keys.create(input).team, "acme");
    assert.throws(
      // @ts-expect-error: team must be a string (the input is typed, not unknown)
      () => keys.create({ team: 5 }),
      (error: unknown) => {
        assert.ok(error instanceof HttpError);
        assert.equal(error.status, 400);
        assert.match(error.message, /^Cannot create the API key: 'team'/);
        return true;
      },
    );
    assert.throws(
      () => keys.create({ team: "acme", maxSandboxes: 0 }),
      /Cannot create the API key: 'maxSandboxes': must be at least 1/,
    );
  } finally {
    keys.close();
  }
});
