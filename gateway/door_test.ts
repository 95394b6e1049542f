import assert from "node:assert/strict";
import {
  doorAnswer,
  HOP_HEADER,
  isOwnAddress,
  markerNames,
  newGatewayInstanceId,
  nextHop,
  pathRefusal,
} from "./door.ts";

Deno.test("doorAnswer() refuses a request carrying this gateway's own marker, in the path's dialect", async () => {
  const id = newGatewayInstanceId();
  const cases: [string, unknown][] = [
    ["http://gw/lookupSandbox", undefined],
    ["http://gw/e2b/api/v2/sandboxes", 508],
    ["http://gw/e2b/envd/process.Process/Start", "internal"],
    ["http://gw/e2b/envd/files?path=/a", 508],
    ["http://gw/files?path=/a", 508],
  ];
  for (const [url, code] of cases) {
    const answer = doorAnswer(
      new Request(url, { headers: { [HOP_HEADER]: `gw-other, ${id}` } }),
      id,
    );
    assert.equal(answer?.status, 508, url);
    const body = await answer!.json();
    assert.equal(body.code, code, url);
    assert.match(body.message, /came back to the gateway that sent it/);
    assert.match(body.message, /DORMICE_NODE_ENDPOINT.*removeNode/);
  }
  // Another gateway's marker, or none, is let through.
  const other = new Request("http://gw/lookupSandbox", { headers: { [HOP_HEADER]: "gw-other" } });
  assert.equal(doorAnswer(other, id), undefined);
  assert.equal(doorAnswer(new Request("http://gw/lookupSandbox"), id), undefined);
});

Deno.test("markerNames() and nextHop() keep the chain of gateways a request went through", () => {
  assert.equal(nextHop(null, "gw-a"), "gw-a");
  assert.equal(nextHop("gw-b", "gw-a"), "gw-b, gw-a");
  assert.equal(markerNames("gw-b, gw-a", "gw-a"), true);
  assert.equal(markerNames("gw-b, gw-a", "gw-b"), true);
  // A prefix of another id is not that id.
  assert.equal(markerNames("gw-ab", "gw-a"), false);
  assert.equal(markerNames(null, "gw-a"), false);
  assert.notEqual(newGatewayInstanceId(), newGatewayInstanceId());
});

Deno.test("pathRefusal() names dot segments and backslashes in the raw path, not in the query", () => {
  for (
    const path of [
      "/e2b/envd/../x",
      "/e2b/envd/./x",
      "/e2b/envd/%2e%2e/x",
      "/e2b/envd/%2E./x",
      "/e2b/api/sandboxes/.%2e",
      "/x/../execCommand",
      "/e2b/envd\\..\\x",
    ]
  ) {
    assert.match(
      pathRefusal(`http://gw${path}`) ?? "",
      /'\.' or '\.\.' segment or a backslash/,
      path,
    );
  }
  for (
    const path of [
      "/e2b/envd/files?path=/a/../b",
      "/e2b/envd/process.Process/Start",
      "/.well-known/x",
      "/e2b/api/sandboxes/sbx_1.2",
      "/execCommand",
      "/",
    ]
  ) {
    assert.equal(pathRefusal(`http://gw${path}`), undefined, path);
  }
});

Deno.test("isOwnAddress() tells the gateway's own address where it can", () => {
  const loopback = { hostname: "127.0.0.1", port: 3677 };
  assert.equal(isOwnAddress("http://127.0.0.1:3677", loopback), true);
  assert.equal(isOwnAddress("http://localhost:3677", loopback), true);
  assert.equal(isOwnAddress("https://127.0.0.1:3677", loopback), true);
  assert.equal(isOwnAddress("http://127.0.0.1:3676", loopback), false);
  // Another loopback address reaches another socket: not this gateway.
  assert.equal(isOwnAddress("http://127.0.0.2:3677", loopback), false);
  assert.equal(isOwnAddress("http://10.0.0.5:3677", loopback), false);
  const everywhere = { hostname: "0.0.0.0", port: 80 };
  assert.equal(isOwnAddress("http://127.0.0.9", everywhere), true);
  assert.equal(isOwnAddress("http://[::1]:80", everywhere), true);
  assert.equal(isOwnAddress("http://10.0.0.5", everywhere), false, "cannot tell: the marker will");
  const named = { hostname: "gw.example.com", port: 443 };
  assert.equal(isOwnAddress("https://GW.example.com", named), true);
  assert.equal(isOwnAddress("http://gw.example.com", named), false);
  assert.equal(isOwnAddress("http://127.0.0.1:3677", { hostname: "127.0.0.1", port: 0 }), false);
  assert.equal(isOwnAddress("http://[::1]:3677", { hostname: "::1", port: 3677 }), true);
});
