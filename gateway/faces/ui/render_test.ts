import assert from "node:assert/strict";
import { fleetSections } from "./render.ts";
import type { FleetView } from "./data.ts";
import { Fleet } from "../../fleet/fleet.ts";
import { FakeClock } from "../../../shared/clock.ts";
import { checkIn } from "../../_fixtures_test.ts";

Deno.test("fleetSections() shows a dead node as dead and an unheard one as down, saying why", () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock, deadAfterMs: 600_000 });
  fleet.checkIn(checkIn("gone", "http://10.0.0.1:3676"));
  clock.tick(600_031);
  fleet.checkIn(checkIn("far", "http://10.0.0.2:3676"));
  fleet.checkIn(checkIn("near", "http://10.0.0.3:3676"));
  fleet.replicaAsOf(clock.now()); // etcd read last now, never again
  clock.tick(31_000);
  fleet.checkIn(checkIn("near", "http://10.0.0.3:3676"));
  const view: FleetView = {
    now: clock.now(),
    nodes: fleet.list(),
    sandboxes: { rows: [], total: 0, page: 1, pages: 1, unreachable: [] },
    placements: [],
    filters: { page: 1 },
    options: { teams: [], states: [], nodes: [] },
  };
  const html = fleetSections(view).nodes;
  const row = (id: string) => html.slice(html.indexOf(`data-node="${id}"`)).split("</tr>")[0];
  assert.match(row("gone"), /<span class="dead">dead<\/span>/);
  assert.match(
    row("far"),
    /<span class="down">down<\/span><br><span class="muted">unheard: etcd unreadable/,
  );
  assert.match(row("near"), /<span class="up">up<\/span><\/td>/);
  fleet.close();
});

Deno.test("fleetSections() lists the volumes with their node's state, escaped", () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock, deadAfterMs: 600_000 });
  fleet.checkIn(checkIn("node-a", "http://10.0.0.1:3676"));
  const row = {
    id: "vol-0123456789abcdef0123",
    team: "acme",
    name: "<b>data</b>",
    node: "node-a",
    shared: false,
    state: "moving" as const,
    sizeBytes: 1e9,
    createdAt: "2026-12-07T00:00:00Z",
  };
  const view: FleetView = {
    now: clock.now(),
    nodes: fleet.list(),
    sandboxes: { rows: [], total: 0, page: 1, pages: 1, unreachable: [] },
    placements: [],
    filters: { page: 1 },
    options: { teams: [], states: [], nodes: [] },
    volumes: { rows: [row, { ...row, node: "gone", state: "ready" as const }], total: 3 },
  };
  const html = fleetSections(view).volumes;
  assert.match(html, /&lt;b&gt;data&lt;\/b&gt;/);
  assert.match(html, /node-a <span class="up">up<\/span><\/td><td>moving/);
  assert.match(html, /gone <span class="down">removed<\/span>/);
  assert.match(html, /and 1 more/);
  assert.match(fleetSections({ ...view, volumes: undefined }).volumes, /No volume/);
  fleet.close();
});
