/**
 * The template and snapshot routes ask only the nodes that may hold what they name (their
 * check-ins advertise it): an update, a build's status another gateway accepted, a create by a
 * snapshot's name and the template listing, at 3 and 200 stub nodes. A delete is the exception:
 * it tells every node, so a copy not advertised yet does not outlive it.
 */
import assert from "node:assert/strict";
import { checkIn, reading } from "../../_fixtures_test.ts";
import { api, type StubNode, templateFleet as fleet } from "./_fixtures_test.ts";

const TEMPLATE = "snap-agentagentagentagent";

/** How many requests under `/e2b/api/` each node was asked (nodes asked none left out). */
function asked(nodes: StubNode[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const n of nodes) {
    const count = n.calls.filter((c) => c.includes(" /e2b/api/")).length;
    if (count > 0) out.set(n.id, count);
  }
  return out;
}

function reset(nodes: StubNode[]): void {
  for (const n of nodes) n.calls = [];
}

Deno.test("an update asks the template's holder only; a delete tells every node", async () => {
  const everyNode = (nodes: StubNode[], extra?: [string, number]) =>
    new Map(nodes.map((n) => [n.id, n.id === extra?.[0] ? extra[1] : 1]));
  for (const size of [3, 200]) {
    let { gateway, nodes, holder } = fleet(size);
    reset(nodes);
    let res = await api(gateway, "PATCH", `/v2/templates/${TEMPLATE}`, { public: true });
    assert.equal(res.status, 200, await res.text());
    assert.deepEqual(asked(nodes), new Map([[holder.id, 1]]));

    reset(nodes);
    res = await api(gateway, "PATCH", "/v2/templates/snap-nosuchnosuchnosuchno", { public: true });
    assert.equal(res.status, 404);
    await res.body?.cancel();
    assert.deepEqual(asked(nodes), new Map());

    // A delete leaves no copy behind: a node that pulled or healed the template a moment ago
    // may not advertise it yet, so every node is told.
    reset(nodes);
    res = await api(gateway, "DELETE", `/templates/${TEMPLATE}`);
    assert.equal(res.status, 204, await res.text());
    assert.deepEqual(asked(nodes), everyNode(nodes));
    await gateway.close();

    // By name, as E2B takes it: the name read of the holder, then the delete to every node.
    ({ gateway, nodes, holder } = fleet(size));
    reset(nodes);
    res = await api(gateway, "DELETE", "/templates/agent");
    assert.equal(res.status, 204, await res.text());
    assert.deepEqual(asked(nodes), everyNode(nodes, [holder.id, 2]));
    assert.equal(holder.snapshots.length, 0);
    await gateway.close();
  }
});

Deno.test("a build's status another gateway accepted is asked of the template's holder", async () => {
  for (const size of [3, 200]) {
    const { gateway, nodes, holder } = fleet(size);
    holder.builds.add(`${TEMPLATE}/b2`);
    reset(nodes);
    const res = await api(gateway, "GET", `/templates/${TEMPLATE}/builds/b2/status`);
    assert.equal(res.status, 200, await res.text());
    assert.deepEqual(asked(nodes), new Map([[holder.id, 1]]));

    // A build no node advertises (one gateway, restarted mid-build): every node is asked.
    const other = nodes.find((n) => n !== holder)!;
    other.builds.add("snap-buildingbuildingbuil/b3");
    reset(nodes);
    const found = await api(
      gateway,
      "GET",
      "/templates/snap-buildingbuildingbuil/builds/b3/status",
    );
    assert.equal(found.status, 200, await found.text());
    assert.equal(asked(nodes).size, size);
    await gateway.close();
  }
});

Deno.test("a create by a snapshot's name asks its holder only, an unknown name no node", async () => {
  for (const size of [3, 200]) {
    const { gateway, nodes, holder } = fleet(size);
    reset(nodes);
    let res = await api(gateway, "POST", "/v2/sandboxes", { templateID: "agent" });
    assert.equal(res.status, 201, await res.text());
    const reads = (n: StubNode) => n.calls.filter((c) => c.startsWith("GET /e2b/api/snapshots"));
    assert.deepEqual(nodes.filter((n) => reads(n).length > 0).map((n) => n.id), [holder.id]);
    assert.deepEqual(nodes.flatMap((n) => n.createBodies.map((b) => b.templateID)), [TEMPLATE]);

    reset(nodes);
    res = await api(gateway, "POST", "/v2/sandboxes", { templateID: "nosuch" });
    await res.body?.cancel();
    assert.deepEqual(nodes.filter((n) => reads(n).length > 0).map((n) => n.id), []);
    await gateway.close();
  }
});

Deno.test("the template listing asks the nodes advertising the team's names", async () => {
  for (const size of [3, 200]) {
    const { gateway, nodes, holder } = fleet(size);
    // Another team's snapshot elsewhere: that node holds nothing of this team's.
    const other = nodes.find((n) => n !== holder)!;
    gateway.fleet.checkIn(checkIn(other.id, other.endpoint, {
      reading: reading(),
      templates: ["base"],
      snapshots: ["snap-othersothersothers01"],
      snapshotNames: ["acme/tool"],
    }));
    reset(nodes);
    const res = await api(gateway, "GET", "/templates");
    assert.equal(res.status, 200);
    const list = await res.json() as { templateID: string; aliases: string[] }[];
    assert.deepEqual(
      list.map((t) => t.templateID),
      ["base", TEMPLATE],
    );
    assert.deepEqual(asked(nodes), new Map([[holder.id, 1]]));
    await gateway.close();
  }
});
