/**
 * The gateway's E2B snapshot routes over stub nodes: the list merged and paged across nodes,
 * a delete told to every node, and a create from a snapshot placed on its holder (advertised,
 * or found by asking), with the holder-down 503.
 */
import assert from "node:assert/strict";
import { FakeClock } from "../../../shared/clock.ts";
import type { SnapshotRow } from "../../../shared/snapshots.ts";
import { api, setup, token } from "./_fixtures_test.ts";
import { checkIn, reading } from "../../_fixtures_test.ts";
import { UNREACHABLE_HEADER } from "./merge.ts";

const ids = ["a", "b", "c", "d"].map((c) => `snap-${c.repeat(20)}`);

function row(id: string, at: number, name?: string): SnapshotRow {
  return {
    snapshotID: id,
    names: name ? [name] : [],
    sandboxID: "s",
    node: "?",
    createdAt: new Date(1_800_000_000_000 + at * 1000).toISOString(),
  };
}

Deno.test("E2B api: GET /snapshots merges every node's rows and pages across them", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  a.snapshots = [row(ids[0], 1), row(ids[2], 3)];
  b.snapshots = [row(ids[1], 2), row(ids[3], 4)];
  try {
    const page = async (query: string) => {
      const res = await api(gateway, "GET", `/snapshots${query}`);
      assert.equal(res.status, 200, query);
      const body: SnapshotRow[] = await res.json();
      return { body, next: res.headers.get("x-next-token"), headers: res.headers };
    };
    const first = await page("?limit=2");
    assert.deepEqual(first.body.map((r) => r.snapshotID), ids.slice(0, 2));
    // Each row names the node that answered it.
    assert.deepEqual(first.body.map((r) => r.node), ["a", "b"]);
    assert.ok(first.next);
    const second = await page(`?limit=2&nextToken=${first.next}`);
    assert.deepEqual(second.body.map((r) => r.snapshotID), ids.slice(2));
    assert.equal(second.next, null);
    b.silent = true;
    const partial = await page("");
    assert.deepEqual(partial.body.map((r) => r.snapshotID), [ids[0], ids[2]]);
    assert.equal(partial.headers.get(UNREACHABLE_HEADER), "b");
    const bad = await api(gateway, "GET", "/snapshots?limit=500");
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).code, 400);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: DELETE /templates/{snapshot id} is told to every node, advertised or not", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const advertise = (n: { id: string; endpoint: string }, snapshots: string[]) =>
    gateway.fleet.checkIn(
      checkIn(n.id, n.endpoint, { reading: reading(), templates: ["base"], snapshots }),
    );
  const deletes = (n: { calls: string[] }) => n.calls.filter((c) => c.startsWith("DELETE ")).length;
  b.snapshots = [row(ids[0], 1)];
  advertise(b, [ids[0]]);
  // A copy a pulled or healed a moment ago, not in its check-in yet.
  a.snapshots = [row(ids[0], 1)];
  try {
    const del = (id: string) => api(gateway, "DELETE", `/templates/${id}`);
    assert.equal((await del(ids[0])).status, 204);
    assert.deepEqual(b.snapshots, []);
    assert.deepEqual(a.snapshots, [], "the copy a did not advertise is gone too");
    // Every node says it has none: a 404.
    const none = await del(ids[0]);
    assert.equal(none.status, 404);
    assert.equal((await none.json()).code, 404);
    assert.deepEqual([deletes(a), deletes(b)], [2, 2]);
    // A node that does not answer may hold it: not a 404, a 503 naming it.
    a.snapshots = [row(ids[2], 1)];
    advertise(a, [ids[2]]);
    a.silent = true;
    const silent = await del(ids[2]);
    assert.equal(silent.status, 503);
    assert.match((await silent.json()).message, /'a' did not answer \(it may hold it\)/);
    // One that deleted it while another did not answer: done, the silent one named.
    b.snapshots = [row(ids[2], 1)];
    advertise(b, [ids[2]]);
    const partly = await del(ids[2]);
    assert.equal(partly.status, 204);
    assert.equal(partly.headers.get(UNREACHABLE_HEADER), "a");
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a create from a snapshot lands on its holder, advertised or found by asking", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const { gateway, add } = setup({ clock });
  const a = add("a");
  const b = add("b");
  const advertise = (id: string, endpoint: string, snapshots: string[]) =>
    gateway.fleet.checkIn(
      checkIn(id, endpoint, { reading: reading(), templates: ["base"], snapshots }),
    );
  try {
    const create = (templateID: string) =>
      api(gateway, "POST", "/v2/sandboxes", { templateID, metadata: {} });
    // Advertised by b: every create goes to b, told the id.
    advertise("a", a.endpoint, []);
    advertise("b", b.endpoint, [ids[0]]);
    for (let i = 0; i < 4; i++) assert.equal((await create(ids[0])).status, 201);
    assert.equal(a.createBodies.length, 0);
    assert.deepEqual(b.createBodies.map((body) => body.templateID), Array(4).fill(ids[0]));
    // Taken since the last check-ins: the nodes are asked, and a answers it holds it.
    a.snapshots = [row(ids[1], 1, "ready")];
    assert.equal((await create(ids[1])).status, 201);
    assert.equal(a.createBodies.length, 1);
    // By name: the holder's id, on the holder (asked as it advertises the name, as a take's
    // pushed check-in does).
    gateway.fleet.checkIn(checkIn("a", a.endpoint, {
      reading: reading(),
      templates: ["base"],
      snapshots: [ids[1]],
      snapshotNames: ["default/ready"],
    }));
    assert.equal((await create("ready")).status, 201);
    assert.deepEqual(a.createBodies.map((body) => body.templateID), [ids[1], ids[1]]);
    // No node holds it: E2B's 404, no node asked to create.
    const missing = await create(ids[2]);
    assert.equal(missing.status, 404);
    assert.match((await missing.json()).message, /not found on any node/);
    // Its only holder down: a 503 naming it, never a create elsewhere.
    clock.tick(60_000);
    advertise("a", a.endpoint, []);
    const down = await create(ids[0]);
    assert.equal(down.status, 503);
    assert.match(
      (await down.json()).message,
      new RegExp(`Snapshot '${ids[0]}' is held only by node 'b', which is down`),
    );
    assert.equal(a.createBodies.length, 2);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a create from a snapshot whose holder is full heals on another node; down, only with a registry", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const { gateway, add } = setup({ clock });
  const a = add("a");
  const b = add("b");
  const advertise = (id: string, endpoint: string, active: number, extra = {}) =>
    gateway.fleet.checkIn(
      checkIn(id, endpoint, {
        reading: reading({ active }),
        templates: ["base"],
        snapshots: id === "b" ? [ids[0]] : [],
        ...extra,
      }),
    );
  const create = () => api(gateway, "POST", "/v2/sandboxes", { templateID: ids[0], metadata: {} });
  try {
    // The holder at the active limit: the create goes to a, told to heal from b first.
    advertise("a", a.endpoint, 0);
    advertise("b", b.endpoint, 400);
    assert.equal((await create()).status, 201);
    assert.deepEqual(a.createBodies.map((body) => body.templateID), [ids[0]]);
    assert.deepEqual(a.healFrom, [`b=${b.endpoint}`]);
    assert.equal(b.createBodies.length, 0);
    // The holder with room: it takes the create itself, no heal.
    advertise("b", b.endpoint, 0);
    assert.equal((await create()).status, 201);
    assert.deepEqual(b.healFrom, [null]);
    // The holder down, no registry: a 503 naming it.
    clock.tick(60_000);
    advertise("a", a.endpoint, 0);
    const down = await create();
    assert.equal(down.status, 503);
    assert.match((await down.json()).message, /held only by node 'b', which is down/);
    // The holder down, a node with a registry up: that node takes it (it pulls from there).
    advertise("a", a.endpoint, 0, { snapshotRegistry: "127.0.0.1:5000" });
    assert.equal((await create()).status, 201);
    assert.equal(a.createBodies.length, 2);
    assert.deepEqual(a.healFrom.at(-1), "");
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a create that needs a heal never goes to a node that takes no heal (DORMICE_SNAPSHOT_HEAL=off)", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const advertise = (id: string, endpoint: string, active: number, extra = {}) =>
    gateway.fleet.checkIn(
      checkIn(id, endpoint, {
        reading: reading({ active }),
        templates: ["base"],
        snapshots: id === "b" ? [ids[0]] : [],
        ...extra,
      }),
    );
  const create = () => api(gateway, "POST", "/v2/sandboxes", { templateID: ids[0], metadata: {} });
  try {
    // The holder at the active limit, the only other node says it takes no heal: no create
    // reaches either, and the holder's refusal stands.
    advertise("a", a.endpoint, 0, { heals: false });
    advertise("b", b.endpoint, 400);
    const refused = await create();
    assert.notEqual(refused.status, 201);
    assert.equal(a.createBodies.length, 0);
    assert.equal(b.createBodies.length, 0);
    // The same node with heals on (absent from its check-in) takes it, told to heal from b.
    advertise("a", a.endpoint, 0);
    assert.equal((await create()).status, 201);
    assert.deepEqual(a.healFrom, [`b=${b.endpoint}`]);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a snapshot taken again on another node starts from that newest build once its pushed check-in is in", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const { gateway, add } = setup({ clock });
  const a = add("a");
  const b = add("b");
  try {
    // a holds build 1 of "ready" and says so; b runs a sandbox and holds nothing yet.
    a.snapshots = [{ ...row(ids[0], 1, "ready"), node: "a" }];
    gateway.fleet.checkIn(
      checkIn("a", a.endpoint, { reading: reading(), templates: ["base"], snapshots: [ids[0]] }),
    );
    gateway.fleet.checkIn(
      checkIn("b", b.endpoint, { reading: reading(), templates: ["base"], snapshots: [] }),
    );
    const sandbox = b.add("src");
    // Taken again on b: the same id (the name is the team's), a newer build; b pushes its
    // check-in before it answers, as a node does.
    b.takenAt = 1_800_000_000_000 + 5_000;
    b.onRetake = async (taken) => {
      const pushed = await gateway.fetch(
        new Request("http://gw.test/checkIn", {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify(checkIn("b", b.endpoint, {
            reading: reading(),
            templates: ["base"],
            snapshots: [taken.snapshotID],
            snapshotRetaken: taken.snapshotID,
          })),
        }),
      );
      assert.equal(pushed.status, 200, await pushed.text());
    };
    const taken = await api(gateway, "POST", `/sandboxes/${sandbox.id}/snapshots`, {
      name: "ready",
    });
    assert.equal(taken.status, 201, await taken.clone().text());
    assert.equal((await taken.json()).snapshotID, ids[0]);
    const created = await api(gateway, "POST", "/v2/sandboxes", { templateID: ids[0] });
    assert.equal(created.status, 201, await created.clone().text());
    // On b, or on a told to get b's newer build first: never from a's older build as it is.
    if (b.createBodies.length === 1) {
      assert.equal(b.createBodies[0].templateID, ids[0]);
      assert.equal(a.createBodies.length, 0);
    } else {
      assert.equal(a.createBodies.length, 1);
      assert.match(a.healFrom[0] ?? "", /^b=/, "a holds the older build: it heals from b first");
    }
  } finally {
    gateway.close();
  }
});
