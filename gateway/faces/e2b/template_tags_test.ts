/**
 * Tag reads ask only the nodes that may hold the template: a tagged create (`name:tag`) and the
 * tag routes, over in-process stub nodes whose check-ins advertise what they hold.
 */
import assert from "node:assert/strict";
import { checkIn, reading } from "../../_fixtures_test.ts";
import { api, type StubNode, templateFleet as fleet } from "./_fixtures_test.ts";

const TEMPLATE = "snap-agentagentagentagent";

/** The requests each node was asked whose path starts with one of `prefixes`. */
function asked(nodes: StubNode[], ...prefixes: string[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const n of nodes) {
    const count = n.calls.filter((c) => prefixes.some((p) => c.includes(p))).length;
    if (count > 0) out.set(n.id, count);
  }
  return out;
}

function reset(nodes: StubNode[]): void {
  for (const n of nodes) n.calls = [];
}

Deno.test("a tagged create reads the template and its tags from its holder only", async () => {
  for (const size of [3, 200]) {
    const { gateway, nodes, holder } = fleet(size);
    reset(nodes);
    const res = await api(gateway, "POST", "/v2/sandboxes", { templateID: "agent:v1" });
    assert.equal(res.status, 201, await res.text());
    // The tags were read of the holder alone.
    assert.deepEqual(asked(nodes, `/templates/${TEMPLATE}/tags`), new Map([[holder.id, 1]]));
    // The name was read of the holder alone, once: the create is placed by the id it found.
    assert.deepEqual(asked(nodes, "GET /e2b/api/snapshots"), new Map([[holder.id, 1]]));
    assert.deepEqual(nodes.flatMap((n) => n.createBodies.map((b) => b.templateID)), [TEMPLATE]);
    assert.equal(nodes.reduce((sum, n) => sum + n.createBodies.length, 0), 1);
    await gateway.close();
  }
});

Deno.test("the tag routes ask the holder only, and an unknown template no node", async () => {
  const { gateway, nodes, holder } = fleet(5);
  reset(nodes);
  let res = await api(gateway, "GET", "/templates/agent/tags");
  assert.equal(res.status, 200);
  const tags = await res.json() as { tag: string; buildID: string }[];
  assert.deepEqual(tags.map((t) => t.tag).sort(), ["default", "v1"]);
  assert.deepEqual(asked(nodes, "/e2b/api/"), new Map([[holder.id, 2]]));

  reset(nodes);
  res = await api(gateway, "GET", "/templates/nosuch/tags");
  assert.equal(res.status, 404);
  assert.match((await res.json()).message, /Template 'nosuch' not found/);
  assert.deepEqual(asked(nodes, "/e2b/api/"), new Map());

  reset(nodes);
  res = await api(gateway, "GET", `/templates/snap-nosuchnosuchnosuchno/tags`);
  assert.equal(res.status, 404);
  assert.deepEqual(asked(nodes, "/e2b/api/"), new Map());
  await gateway.close();
});

Deno.test("a node whose advertisement is cut at its cap is asked too", async () => {
  const { gateway, nodes, holder } = fleet(4);
  const full = nodes.find((n) => n !== holder)!;
  gateway.fleet.checkIn(checkIn(full.id, full.endpoint, {
    reading: reading(),
    templates: ["base"],
    snapshots: [],
    snapshotsTruncated: true,
  }));
  reset(nodes);
  const res = await api(gateway, "GET", "/templates/agent/tags");
  assert.equal(res.status, 200);
  assert.deepEqual(
    new Set(asked(nodes, "/e2b/api/").keys()),
    new Set([holder.id, full.id]),
  );
  await gateway.close();
});
