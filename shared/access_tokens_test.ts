import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  AccessTokens,
  envdCredentialsRefusal,
  envdRefusal,
  envdRequestAuthorized,
  fileSignature,
  isExpired,
  parseSignedFileUrl,
  refusalHeaders,
  SignatureLocator,
  signatureMatches,
  SIGNED_URL_EXPIRED,
} from "./access_tokens.ts";

const secret = "a node secret that is long enough!!";

Deno.test("AccessTokens.forSandbox() is a stable base64url HMAC per sandbox", () => {
  const tokens = new AccessTokens(secret);
  const a = tokens.forSandbox("sbx-a");
  assert.equal(a, tokens.forSandbox("sbx-a"));
  assert.notEqual(a, tokens.forSandbox("sbx-b"));
  assert.match(a, /^[A-Za-z0-9_-]{43}$/);
  assert.notEqual(a, new AccessTokens(secret + "x").forSandbox("sbx-a"));
});

Deno.test("AccessTokens.verify() accepts the sandbox's token only", () => {
  const tokens = new AccessTokens(secret);
  assert.equal(tokens.verify("s1", tokens.forSandbox("s1")), true);
  assert.equal(tokens.verify("s1", tokens.forSandbox("s2")), false);
  assert.equal(tokens.verify("s1", undefined), false);
  assert.equal(tokens.verify("s1", ""), false);
});

Deno.test("new AccessTokens() refuses a secret shorter than 32", () => {
  assert.throws(() => new AccessTokens("short"), RangeError);
});

Deno.test("fileSignature() matches the e2b SDK's formula", () => {
  // The SDK: "v1_" + base64(sha256(`${path}:${operation}:${user}:${token}[:${exp}]`)) minus "=".
  const expected = (raw: string) =>
    "v1_" + createHash("sha256").update(raw).digest("base64").replace(/=+$/, "");
  assert.equal(
    fileSignature({ path: "/tmp/a", operation: "read", user: "", accessToken: "tok" }),
    expected("/tmp/a:read::tok"),
  );
  assert.equal(
    fileSignature({
      path: "/tmp/a",
      operation: "write",
      user: "root",
      accessToken: "tok",
      expiration: 1700000000,
    }),
    expected("/tmp/a:write:root:tok:1700000000"),
  );
});

Deno.test("parseSignedFileUrl() reads path, username, signature and expiration", () => {
  const r = parseSignedFileUrl(
    new URL(
      "http://n/files?path=%2Ftmp%2Fa&username=root&signature=v1_abc&signature_expiration=12",
    ),
    "read",
  );
  assert.deepEqual(r, {
    ok: true,
    value: { path: "/tmp/a", user: "root", operation: "read", signature: "v1_abc", expiration: 12 },
  });
  assert.equal(parseSignedFileUrl(new URL("http://n/files?path=/a"), "read").ok, false);
  assert.equal(parseSignedFileUrl(new URL("http://n/files?signature=v2_x"), "read").ok, false);
  assert.equal(
    parseSignedFileUrl(new URL("http://n/files?signature=v1_x&signature_expiration=soon"), "read")
      .ok,
    false,
  );
});

Deno.test("signatureMatches() and isExpired() judge a signed request", () => {
  const signature = fileSignature({
    path: "/a",
    operation: "read",
    user: "",
    accessToken: "t",
    expiration: 100,
  });
  const request = { path: "/a", operation: "read" as const, user: "", signature, expiration: 100 };
  assert.equal(signatureMatches(request, "t"), true);
  assert.equal(signatureMatches(request, "u"), false);
  assert.equal(signatureMatches({ ...request, operation: "write" }, "t"), false);
  assert.equal(signatureMatches({ ...request, expiration: 101 }, "t"), false);
  assert.equal(isExpired(request, 100_000), false);
  assert.equal(isExpired(request, 100_001), true);
  assert.equal(isExpired({ ...request, expiration: undefined }, 1e15), false);
});

Deno.test("SignatureLocator.find() picks the sandbox whose token signed the URL", () => {
  const tokens = new AccessTokens(secret);
  const locator = new SignatureLocator(tokens, { maxHints: 2 });
  const ids = ["s1", "s2", "s3"];
  const sign = (id: string, path: string) => ({
    path,
    operation: "read" as const,
    user: "",
    signature: fileSignature({
      path,
      operation: "read",
      user: "",
      accessToken: tokens.forSandbox(id),
    }),
  });
  assert.equal(locator.find(sign("s2", "/x"), ids), "s2");
  assert.equal(locator.find(sign("s2", "/x"), ids), "s2"); // from the hint, re-verified
  assert.equal(locator.find(sign("s2", "/x"), ["s1", "s3"]), undefined); // s2 is gone
  assert.equal(locator.find(sign("s9", "/x"), ids), undefined);
  assert.equal(locator.find({ ...sign("s3", "/x"), path: "/y" }, ids), undefined); // altered
});

Deno.test("AccessTokens.fromFleetToken() is stable and differs from the fleet token itself", () => {
  const fleet = "the fleet token of at least 32 characters";
  const a = AccessTokens.fromFleetToken(fleet).forSandbox("s1");
  assert.equal(a, AccessTokens.fromFleetToken(fleet).forSandbox("s1"));
  assert.notEqual(a, new AccessTokens(fleet).forSandbox("s1"));
  assert.notEqual(a, AccessTokens.fromFleetToken(fleet + "!").forSandbox("s1"));
});

Deno.test("envdRequestAuthorized() takes the token, or a live signature where signed URLs count", () => {
  const tokens = new AccessTokens(secret);
  const token = tokens.forSandbox("sbx-1");
  const signature = fileSignature({
    path: "/a",
    operation: "write",
    user: "",
    accessToken: token,
    expiration: 2_000,
  });
  const signedUrl = new URL(
    `http://n/files?path=/a&signature=${encodeURIComponent(signature)}&signature_expiration=2000`,
  );
  const check = (over: Partial<Parameters<typeof envdRequestAuthorized>[2]>, now = 1_000_000) =>
    envdRequestAuthorized(tokens, "sbx-1", {
      accessToken: undefined,
      url: new URL("http://n/files?path=/a"),
      method: "POST",
      signedUrlAllowed: true,
      ...over,
    }, now);
  assert.equal(check({ accessToken: token }), true);
  assert.equal(check({ accessToken: tokens.forSandbox("sbx-2") }), false);
  assert.equal(check({}), false);
  assert.equal(check({ url: signedUrl }), true);
  assert.equal(check({ url: signedUrl, method: "GET" }), false, "signed for write, not read");
  assert.equal(check({ url: signedUrl, signedUrlAllowed: false }), false);
  assert.equal(check({ url: signedUrl }, 2_000_001), false, "expired");
  assert.match(envdCredentialsRefusal("sbx-1", true), /does not belong to sandbox 'sbx-1'/);
  assert.match(envdCredentialsRefusal("sbx-1", false), /needs the X-Access-Token header/);
});

Deno.test("envdRefusal() says a signed URL expired in E2B's words, only when its sandbox signed it", () => {
  const tokens = new AccessTokens(secret);
  const url = (token: string, expiration: number) =>
    new URL(
      `http://n/files?path=/a&signature=${
        encodeURIComponent(
          fileSignature({
            path: "/a",
            operation: "read",
            user: "",
            accessToken: token,
            expiration,
          }),
        )
      }&signature_expiration=${expiration}`,
    );
  const refusal = (over: Partial<Parameters<typeof envdRefusal>[2]>) =>
    envdRefusal(tokens, "sbx-1", {
      accessToken: null,
      url: new URL("http://n/files?path=/a"),
      method: "GET",
      signedUrlAllowed: true,
      ...over,
    }, 1_000_000);
  assert.equal(refusal({ url: url(tokens.forSandbox("sbx-1"), 10) }), SIGNED_URL_EXPIRED);
  assert.equal(SIGNED_URL_EXPIRED, "signature is already expired");
  assert.match(refusalHeaders(SIGNED_URL_EXPIRED)["x-dormice-hint"], /fresh URL/);
  assert.deepEqual(refusalHeaders("anything else"), {});
  // Signed by another sandbox: the signature does not match (expired or not), never "needs the
  // header", which sends the user looking for a token the URL was meant to replace.
  assert.match(
    refusal({ url: url(tokens.forSandbox("sbx-2"), 10) }),
    /^The \/files URL's signature does not match sandbox 'sbx-1': .*ask the SDK for a fresh URL/,
  );
  // Where signatures do not count: the usual sentence.
  assert.match(
    refusal({ url: url(tokens.forSandbox("sbx-1"), 10), signedUrlAllowed: false }),
    /needs the X-Access-Token/,
  );
  assert.match(refusal({ accessToken: "wrong" }), /does not belong to sandbox 'sbx-1'/);
});

Deno.test("envdRefusal() says a tampered signed URL's signature does not match, not that a header is missing", () => {
  const tokens = new AccessTokens(secret);
  const signature = fileSignature({
    path: "/a",
    operation: "read",
    user: "user",
    accessToken: tokens.forSandbox("sbx-1"),
  });
  const refusal = (query: string, method = "GET") =>
    envdRefusal(tokens, "sbx-1", {
      accessToken: null,
      url: new URL(`http://n/files?${query}`),
      method,
      signedUrlAllowed: true,
    }, 1_000_000);
  const s = encodeURIComponent(signature);
  const good = `path=/a&username=user&signature=${s}`;
  assert.equal(
    envdRequestAuthorized(tokens, "sbx-1", {
      accessToken: null,
      url: new URL(`http://n/files?${good}`),
      method: "GET",
      signedUrlAllowed: true,
    }, 1_000_000),
    true,
    "the untampered URL is accepted",
  );
  for (
    const [query, method] of [
      [`path=/etc/passwd&username=user&signature=${s}`, "GET"],
      [`path=/a&username=root&signature=${s}`, "GET"],
      [good, "POST"],
      [`path=/a&username=user&signature=v1_AAAA`, "GET"],
    ]
  ) {
    assert.match(refusal(query, method), /signature does not match sandbox 'sbx-1'/, query);
  }
  assert.match(refusal(`path=/a&signature=x1_AAAA`), /not a v1 signature/);
  assert.match(refusal(`path=/a&signature=${s}&signature_expiration=soon`), /must be Unix seconds/);
});
