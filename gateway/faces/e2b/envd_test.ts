import assert from "node:assert/strict";
import { fileSignature } from "../../../shared/access_tokens.ts";
import { api, envd, envdTokens, setup } from "./_fixtures_test.ts";

Deno.test("E2B faces: an invalid sandbox id is a 400 in the face's dialect that asks no node", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  try {
    for (const id of ["x".repeat(129), "bad/id", "bad id!"]) {
      const answers: [string, Response, "e2b" | "connect"][] = [
        ["GET api", await api(gateway, "GET", `/sandboxes/${encodeURIComponent(id)}`), "e2b"],
        ["DELETE api", await api(gateway, "DELETE", `/sandboxes/${encodeURIComponent(id)}`), "e2b"],
        [
          "connect api",
          await api(gateway, "POST", `/v2/sandboxes/${encodeURIComponent(id)}/connect`, {}),
          "e2b",
        ],
        [
          "envd rpc",
          await envd(gateway, "/process.Process/List", { "e2b-sandbox-id": id }, "{}"),
          "connect",
        ],
        ["envd files", await envd(gateway, "/files?path=/a", { "e2b-sandbox-id": id }), "e2b"],
        [
          "root files",
          await gateway.fetch(
            new Request("http://gw.test/files?path=/a&signature=v1_x", {
              headers: { "e2b-sandbox-id": id },
            }),
          ),
          "e2b",
        ],
      ];
      for (const [where, res, dialect] of answers) {
        assert.equal(res.status, 400, `${where} ${id}`);
        const body = await res.json();
        assert.equal(body.code, dialect === "connect" ? "invalid_argument" : 400, where);
        assert.match(body.message, /is not a sandbox id: a sandbox id (uses only|has at most 128)/);
        // No node was asked, so none is named (the old answer listed every node's endpoint).
        assert.doesNotMatch(JSON.stringify(body), /\.test:3676/, where);
      }
    }
    assert.deepEqual([...a.calls, ...b.calls], []);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: requests without the sandbox's token or signature are 401s that reach no node", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const s = a.add("x");
  const other = envdTokens.forSandbox(`${s.id}-other`);
  // Signed for a write: every request below is a POST.
  const expired = fileSignature({
    path: "/a",
    operation: "write",
    user: "",
    accessToken: envdTokens.forSandbox(s.id),
    expiration: 1,
  });
  try {
    // A flood of random ids with no token, a wrong token, or a bad or expired signature.
    const floods: [string, Record<string, string>, RegExp, "connect" | "rest"][] = [];
    for (let i = 0; i < 50; i++) {
      const id = `rnd-${crypto.randomUUID()}`;
      floods.push([
        "/process.Process/List",
        { "e2b-sandbox-id": id },
        /needs the X-Access/,
        "connect",
      ]);
      floods.push([
        "/health",
        { "e2b-sandbox-id": id, "x-access-token": other },
        /does not belong/,
        "rest",
      ]);
    }
    floods.push([
      "/process.Process/List",
      { "e2b-sandbox-id": s.id, "x-access-token": other },
      /does not belong/,
      "connect",
    ]);
    floods.push([
      "/files?path=/a&signature=v1_forged",
      { "e2b-sandbox-id": s.id },
      /signature does not match sandbox/,
      "rest",
    ]);
    floods.push([
      `/files?path=/a&signature=${encodeURIComponent(expired)}&signature_expiration=1`,
      { "e2b-sandbox-id": s.id },
      // E2B envd's words exactly: the SDK's tests compare the whole body (the remedy rides in
      // the X-Dormice-Hint header).
      /^signature is already expired$/,
      "rest",
    ]);
    // A signature only stands in for the token on REST doors, as on the node.
    floods.push([
      `/process.Process/List?signature=${encodeURIComponent(expired)}`,
      { "e2b-sandbox-id": s.id },
      /needs/,
      "connect",
    ]);
    for (const [path, headers, message, dialect] of floods) {
      const res = await envd(gateway, path, headers, "{}");
      assert.equal(res.status, 401, path);
      const body = await res.json();
      assert.equal(body.code, dialect === "connect" ? "unauthenticated" : 401, path);
      assert.match(body.message, message);
    }
    const door = await gateway.fetch(
      new Request("http://gw.test/files?path=/a&signature=v1_forged", {
        headers: { "e2b-sandbox-id": s.id },
      }),
    );
    assert.equal(door.status, 401);
    assert.equal((await door.json()).code, 401);
    // Not one lookup, not one forward: the nodes never heard of any of it.
    assert.deepEqual([...a.calls, ...b.calls], []);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: forwarded by E2b-Sandbox-Id with the client's headers untouched", async () => {
  const { gateway, add } = setup();
  add("a");
  const b = add("b");
  const s = b.add("x");
  try {
    const res = await envd(gateway, "/files?path=/tmp/a", {
      "e2b-sandbox-id": s.id,
      "x-access-token": envdTokens.forSandbox(s.id),
      "authorization": "Basic cm9vdDo=",
      "content-type": "application/octet-stream",
    }, new Uint8Array([1, 2, 3]));
    assert.equal(res.status, 200);
    assert.equal(await res.text(), "from b");
    assert.equal(b.envdSeen?.path, "/e2b/envd/files?path=/tmp/a");
    assert.equal(b.envdSeen?.headers.get("x-access-token"), envdTokens.forSandbox(s.id));
    assert.equal(b.envdSeen?.headers.get("authorization"), "Basic cm9vdDo=");
    assert.equal(b.envdSeen?.headers.get("content-type"), "application/octet-stream");
    assert.equal(b.envdSeen?.body, "\u0001\u0002\u0003");
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: routing errors in the Connect dialect on RPC paths, {code:int} on REST", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const rpc = "/process.Process/List";
    const noHeader = await envd(gateway, rpc, { "content-type": "application/json" }, "{}");
    assert.equal(noHeader.status, 400);
    assert.equal((await noHeader.json()).code, "invalid_argument");

    const nope = { "e2b-sandbox-id": "nope", "x-access-token": envdTokens.forSandbox("nope") };
    const gone = await envd(gateway, rpc, nope, "{}");
    assert.equal(gone.status, 502);
    assert.equal((await gone.json()).code, "unavailable");
    const goneRest = await envd(gateway, "/files?path=/x", nope);
    assert.equal(goneRest.status, 502);
    assert.equal((await goneRest.json()).code, 502);

    a.silent = true;
    const silent = await envd(gateway, rpc, nope, "{}");
    assert.equal(silent.status, 503);
    assert.ok(silent.headers.get("retry-after"));
    assert.equal((await silent.json()).code, "unavailable");
    const silentRest = await envd(gateway, "/health", nope);
    assert.equal(silentRest.status, 503);
    assert.equal((await silentRest.json()).code, 503);
  } finally {
    gateway.close();
  }
});

Deno.test("the root /files door is a 501 unless the request names its sandbox", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const s = a.add("x");
  try {
    const res = await gateway.fetch(new Request("http://gw.test/files?path=/a&signature=v1_x"));
    assert.equal(res.status, 501);
    const body = await res.json();
    assert.equal(body.code, 501);
    assert.match(body.message, /node's own address/);
    const signature = fileSignature({
      path: "/a",
      operation: "read",
      user: "",
      accessToken: envdTokens.forSandbox(s.id),
    });
    const signed = `/files?path=/a&signature=${encodeURIComponent(signature)}`;
    const named = await gateway.fetch(
      new Request(`http://gw.test${signed}`, { headers: { "e2b-sandbox-id": s.id } }),
    );
    assert.equal(named.status, 200);
    await named.body?.cancel();
    assert.equal(a.envdSeen?.path, `/e2b/envd${signed}`);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: a stream flows as it comes and the client's hang-up aborts the node's request", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const s = a.add("x");
  try {
    const client = new AbortController();
    const res = await gateway.fetch(
      new Request("http://gw.test/e2b/envd/process.Process/Start", {
        method: "POST",
        headers: {
          "e2b-sandbox-id": s.id,
          "x-access-token": envdTokens.forSandbox(s.id),
          "content-type": "application/connect+json",
        },
        body: "{}",
        signal: client.signal,
      }),
    );
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "first");
    assert.equal(a.held?.aborted, false);
    client.abort();
    await reader.cancel().catch(() => {});
    assert.equal(a.held?.aborted, true);
  } finally {
    gateway.close();
  }
});
