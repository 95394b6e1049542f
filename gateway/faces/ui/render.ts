/**
 * The fleet page's HTML, rendered on the server: plain strings, every value escaped, no build
 * step and nothing loaded from elsewhere (the style and the small refresh script are inline,
 * allowed by a per-response CSP nonce). Each section is its own fragment so the refresh script
 * can swap it in place from `GET /ui/fragments`.
 *
 * @module
 */
import type { NodeSummary } from "../../fleet/fleet.ts";
import type { PlacementRecord } from "../../placer/placement_log.ts";
import type { FleetFilters, FleetView, SandboxDetails } from "./data.ts";

/**
 * Escapes text for HTML content and double-quoted attributes.
 *
 * @example
 * ```ts
 * import { escapeHtml } from "./render.ts";
 * escapeHtml('<a href="x">'); // "&lt;a href=&quot;x&quot;&gt;"
 * ```
 */
export function escapeHtml(value: unknown): string {
  return String(value ?? "").replace(
    /[&<>"']/g,
    (c) =>
      c === "&"
        ? "&amp;"
        : c === "<"
        ? "&lt;"
        : c === ">"
        ? "&gt;"
        : c === '"'
        ? "&quot;"
        : "&#39;",
  );
}

const style = `
:root{color-scheme:light;font:14px/1.4 system-ui,sans-serif;--line:#d8dde3;--muted:#5d6b7a}
body{margin:0;background:#f5f7f9;color:#17202a}
header{display:flex;align-items:center;gap:1rem;padding:.6rem 1.2rem;background:#17324d;color:#fff}
header h1{font-size:1.1rem;margin:0;flex:1}
header form{margin:0}
main{padding:1rem 1.2rem;display:grid;gap:1.2rem}
section{background:#fff;border:1px solid var(--line);border-radius:6px;padding:.8rem 1rem}
h2{font-size:1rem;margin:0 0 .6rem}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:.85rem}
meter{width:7rem;height:.9rem;vertical-align:middle}
.num{font-variant-numeric:tabular-nums;color:var(--muted);font-size:.85rem;margin-left:.3rem;white-space:nowrap}
.gauge{white-space:nowrap}
header .muted{color:#c8d3de}
.up,.down,.dead{display:inline-block;padding:0 .5rem;border-radius:1rem;font-size:.8rem;font-weight:600}
.up{background:#d8f3dc;color:#1b5e20}.down{background:#fde2e1;color:#9b1c1c}.dead{background:#e5e7eb;color:#374151}
.muted{color:var(--muted)}
.states span{margin-right:.6rem;white-space:nowrap}
form.filters{display:flex;gap:.6rem;align-items:end;flex-wrap:wrap;margin-bottom:.6rem}
label{display:grid;gap:.15rem;font-size:.8rem;color:var(--muted)}
select,input,button{font:inherit;padding:.25rem .5rem}
button{cursor:pointer}
.pager{display:flex;gap:1rem;margin-top:.5rem;align-items:center}
.login{max-width:26rem;margin:12vh auto}
.login input{width:100%;box-sizing:border-box}
.error{color:#9b1c1c}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem;margin:0}
dt{color:var(--muted)}
code{font-size:.85rem}
`;

/**
 * The refresh script: every five seconds (while the tab is visible) it asks `/ui/fragments` with
 * the page's own query (the filters) and swaps each section in place; a 401 (the session ended)
 * reloads, which shows the login form.
 */
const refreshScript = `
(() => {
  const status = document.getElementById("updated");
  async function refresh() {
    if (document.hidden) return;
    try {
      const res = await fetch("/ui/fragments" + location.search, { credentials: "same-origin" });
      if (res.status === 401) { location.reload(); return; }
      if (!res.ok) throw new Error("HTTP " + res.status);
      const data = await res.json();
      for (const [id, html] of Object.entries(data.sections)) {
        const el = document.getElementById(id);
        if (el) el.innerHTML = html;
      }
      status.textContent = "updated " + new Date(data.at).toLocaleTimeString();
      status.dataset.refreshes = String(Number(status.dataset.refreshes || 0) + 1);
    } catch (error) {
      status.textContent = "refresh failed: " + error.message;
    }
  }
  setInterval(refresh, 5000);
})();
`;

/** A whole page around `body`, with the style and (when given) the refresh script. */
function shell(title: string, nonce: string, body: string, script?: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>${escapeHtml(title)}</title>
<link rel="icon" href="data:,">
<style nonce="${nonce}">${style}</style></head>
<body>${body}${script ? `<script nonce="${nonce}">${script}</script>` : ""}</body></html>`;
}

/**
 * The login form. It posts the token in the body (never in a URL) to `/ui/login`.
 *
 * @example
 * ```ts
 * import { loginPage } from "./render.ts";
 * loginPage("n0nce").includes('action="/ui/login"'); // true
 * ```
 */
export function loginPage(nonce: string, error?: string): string {
  return shell(
    "Dormice fleet: log in",
    nonce,
    `<main><section class="login"><h2>Dormice fleet</h2>
<form method="post" action="/ui/login">
<label>Fleet token (DORMICE_API_TOKEN)<input type="password" name="token" autocomplete="current-password" required autofocus></label>
${error ? `<p class="error" role="alert">${escapeHtml(error)}</p>` : ""}
<p><button type="submit">Log in</button></p></form></section></main>`,
  );
}

/**
 * The fleet page: the nodes, the sandboxes with their filters and pages, the recent placements,
 * the managed volumes.
 *
 * @example
 * ```ts ignore
 * return new Response(fleetPage(await data.view(filters), nonce), { headers });
 * ```
 */
export function fleetPage(view: FleetView, nonce: string): string {
  const s = fleetSections(view);
  return shell(
    "Dormice fleet",
    nonce,
    `${header()}<main>
<section><h2>Nodes</h2><div id="nodes">${s.nodes}</div></section>
<section><h2>Sandboxes</h2>${filtersForm(view)}<div id="sandboxes">${s.sandboxes}</div></section>
<section><h2>Recent placements</h2><div id="placements">${s.placements}</div></section>
<section><h2>Volumes</h2><div id="volumes">${s.volumes}</div></section>
</main>`,
    refreshScript,
  );
}

/**
 * The sections the refresh script swaps in, by element id.
 *
 * @example
 * ```ts ignore
 * return Response.json({ at: view.now, sections: fleetSections(view) });
 * ```
 */
export function fleetSections(
  view: FleetView,
): Record<"nodes" | "sandboxes" | "placements" | "volumes", string> {
  return {
    nodes: nodesTable(view.nodes),
    sandboxes: sandboxesTable(view),
    placements: placementsTable(view.placements, view.now),
    volumes: volumesTable(view),
  };
}

/** The managed volumes: team, name, id, the node that holds it (and whether it is up), state. */
function volumesTable(view: FleetView): string {
  const volumes = view.volumes;
  if (volumes === undefined || volumes.total === 0) {
    return '<p class="muted">No volume: the SDK\'s Volume.create makes one.</p>';
  }
  const state = new Map(view.nodes.map((n) => [n.id, n.state]));
  const rows = volumes.rows.map((v) => {
    const nodeState = state.get(v.node) ?? "removed";
    return `<tr><td>${escapeHtml(v.team)}</td><td>${escapeHtml(v.name)}</td><td><code>${
      escapeHtml(v.id)
    }</code></td><td>${v.shared ? '<span class="muted">shared root</span> ' : ""}${
      escapeHtml(v.node)
    } <span class="${nodeState === "up" ? "up" : "down"}">${nodeState}</span></td><td>${
      escapeHtml(v.state)
    }</td></tr>`;
  }).join("");
  const more = volumes.total > volumes.rows.length
    ? `<p class="muted">and ${volumes.total - volumes.rows.length} more</p>`
    : "";
  return `<table><thead><tr><th>Team</th><th>Name</th><th>Id</th><th>Node</th><th>State</th></tr>
</thead><tbody>${rows}</tbody></table>${more}
<p class="muted">Move one with <code>moveVolume {volumeId, toNode}</code> (fleet token) while no
sandbox mounts it.</p>`;
}

/**
 * One sandbox's page: where it lives, when it was made, its deadline, its latest metrics.
 *
 * @example
 * ```ts ignore
 * return new Response(detailsPage(details, nonce), { headers });
 * ```
 */
export function detailsPage(d: SandboxDetails, nonce: string): string {
  const m = d.metrics;
  const metrics = typeof m === "string" ? `<p class="muted">${escapeHtml(m)}</p>` : `<dl>
<dt>CPU</dt><dd>${meter(m.cpuUsedPct, 100)}<span class="num">${m.cpuUsedPct.toFixed(1)}%</span></dd>
<dt>Memory</dt><dd>${
    m.memTotalBytes > 0 ? meter(m.memUsedBytes, m.memTotalBytes) : ""
  }<span class="num">${bytes(m.memUsedBytes)}${
    m.memTotalBytes > 0 ? ` of ${bytes(m.memTotalBytes)}` : ""
  }</span></dd>
<dt>Disk used</dt><dd><span class="num">${bytes(m.diskUsedBytes)}</span></dd></dl>`;
  const metadata = Object.entries(d.metadata);
  return shell(
    `Sandbox ${d.name}`,
    nonce,
    `${header()}<main><section><h2>Sandbox <code id="sandbox-name">${escapeHtml(d.name)}</code></h2>
<dl>
<dt>Id</dt><dd><code>${escapeHtml(d.id)}</code></dd>
<dt>Team</dt><dd>${escapeHtml(d.team)}</dd>
<dt>State</dt><dd>${escapeHtml(d.state)}</dd>
<dt>Node</dt><dd id="sandbox-node">${escapeHtml(d.nodeId)} <span class="muted">${
      escapeHtml(d.endpoint)
    }</span></dd>
<dt>Template</dt><dd>${escapeHtml(d.template ?? "—")}</dd>
<dt>Created</dt><dd>${escapeHtml(d.createdAt ?? "—")}</dd>
<dt>Deadline</dt><dd id="sandbox-deadline">${
      d.deadlineAt === null
        ? "none (lives until destroyed)"
        : `${escapeHtml(d.deadlineAt)} <span class="muted">then ${
          escapeHtml(d.onDeadline ?? "kill")
        }</span>`
    }</dd>
<dt>Limits</dt><dd>${d.cpuCount ?? "—"} CPU, ${d.memoryMB ?? "—"} MB</dd>
<dt>Metadata</dt><dd>${
      metadata.length === 0
        ? '<span class="muted">none</span>'
        : metadata.map(([k, v]) => `<code>${escapeHtml(k)}=${escapeHtml(v)}</code>`).join(" ")
    }</dd>
</dl></section>
<section><h2>Metrics</h2>${metrics}</section>
<p><a href="/ui">← back to the fleet</a></p></main>`,
  );
}

/**
 * A page saying what went wrong, with a way back.
 *
 * @example
 * ```ts
 * import { messagePage } from "./render.ts";
 * messagePage("n0nce", "No such sandbox", "No node has 'x'").includes("No node has"); // true
 * ```
 */
export function messagePage(nonce: string, title: string, message: string): string {
  return shell(
    title,
    nonce,
    `${header()}<main><section><h2>${escapeHtml(title)}</h2><p>${escapeHtml(message)}</p>
<p><a href="/ui">← back to the fleet</a></p></section></main>`,
  );
}

function header(): string {
  return `<header><h1>Dormice fleet</h1><span id="updated" class="muted"></span>
<form method="post" action="/ui/logout"><button type="submit" id="logout">Log out</button></form></header>`;
}

function nodesTable(nodes: NodeSummary[]): string {
  if (nodes.length === 0) {
    return '<p class="muted">No node has checked in yet: start a node with DORMICE_GATEWAY_ENDPOINT pointing at this gateway.</p>';
  }
  const rows = nodes.map((n) => {
    const r = n.reading;
    const cpu = r?.cpuUsedPct ?? null;
    const mem = r ? r.memoryTotalBytes - r.memoryAvailableBytes : null;
    const disk = r?.dataDisk ?? null;
    const states = r
      ? Object.entries(r.sandboxes).filter(([, c]) => c > 0).map(([s, c]) =>
        `<span>${escapeHtml(s)} <b>${c}</b></span>`
      ).join("") || '<span class="muted">none</span>'
      : '<span class="muted">no reading</span>';
    return `<tr data-node="${escapeHtml(n.id)}">
<td><b>${escapeHtml(n.id)}</b><br><span class="muted">${escapeHtml(n.endpoint)}</span></td>
<td><span class="${n.state}">${n.state}</span>${
      n.unheard ? '<br><span class="muted">unheard: etcd unreadable</span>' : ""
    }</td>
<td>${age(n.lastCheckInAgeMs)}<br><span class="muted">every ${n.intervalSeconds} s</span></td>
<td>${
      cpu === null
        ? '<span class="muted">—</span>'
        : `${meter(cpu, 100)}<span class="num">${cpu.toFixed(0)}%</span>`
    }${r ? `<br><span class="muted">${r.cpuCount} cores</span>` : ""}</td>
<td>${
      r && mem !== null
        ? `${meter(mem, r.memoryTotalBytes)}<span class="num">${bytes(mem)} / ${
          bytes(r.memoryTotalBytes)
        }</span>`
        : '<span class="muted">—</span>'
    }</td>
<td>${
      disk
        ? `${meter(disk.usedBytes, disk.totalBytes)}<span class="num">${
          bytes(disk.availableBytes)
        } free</span>`
        : '<span class="muted">—</span>'
    }</td>
<td class="states">${states}${
      n.inFlight > 0 ? `<span>in flight <b>${n.inFlight}</b></span>` : ""
    }</td>
<td class="states">${
      n.pools.length === 0
        ? '<span class="muted">none</span>'
        : n.pools.map((p) =>
          `<span>${escapeHtml(p.template)}${
            p.spec.cpus !== undefined || p.spec.memoryMB !== undefined
              ? ` ${p.spec.cpus ?? "-"}c/${p.spec.memoryMB ?? "-"}MB`
              : ""
          } <b>${p.warm}/${p.target}</b></span>`
        ).join("")
    }</td>
<td class="states">${namedSnapshots(n.snapshotNames ?? [])}</td>
<td>${n.configDigestMismatch ? '<b class="down">yes</b>' : "no"}</td>
<td><span class="muted">${escapeHtml(n.build)}</span></td></tr>`;
  }).join("");
  return `<table><thead><tr><th>Node</th><th>State</th><th>Last check-in</th><th>CPU</th><th>Memory</th>
<th>Data disk</th><th>Sandboxes</th><th>Pools</th><th>Built templates</th><th>Digest mismatch</th><th>Build</th></tr></thead><tbody>${rows}</tbody></table>`;
}

/** A node's named snapshots (built templates among them) as `team/name`, the first 12 shown. */
function namedSnapshots(names: readonly string[]): string {
  if (names.length === 0) return '<span class="muted">none</span>';
  const shown = names.slice(0, 12).map((n) => `<span>${escapeHtml(n)}</span>`).join("");
  return names.length > 12
    ? `${shown}<span class="muted">+${names.length - 12} more</span>`
    : shown;
}

function filtersForm(view: FleetView): string {
  const select = (name: keyof FleetFilters, label: string, values: readonly string[]) => {
    const current = view.filters[name];
    return `<label>${label}<select name="${name}"><option value="">any</option>${
      values.map((v) =>
        `<option value="${escapeHtml(v)}"${v === current ? " selected" : ""}>${
          escapeHtml(v)
        }</option>`
      ).join("")
    }</select></label>`;
  };
  return `<form class="filters" method="get" action="/ui">
${select("team", "Team", view.options.teams)}${select("state", "State", view.options.states)}${
    select("node", "Node", view.options.nodes)
  }
<button type="submit" id="apply-filters">Filter</button> <a href="/ui">clear</a></form>`;
}

function sandboxesTable(view: FleetView): string {
  const { rows, total, page, pages, unreachable } = view.sandboxes;
  const warn = unreachable.length === 0
    ? ""
    : `<p class="error">Not listed (no answer): ${
      unreachable.map((u) => `${escapeHtml(u.nodeId)} (${escapeHtml(u.cause)})`).join(", ")
    }</p>`;
  if (total === 0) return `${warn}<p class="muted">No sandbox matches.</p>`;
  const body = rows.map((s) =>
    `<tr data-sandbox="${escapeHtml(s.id)}">
<td><a href="/ui/sandboxes/${encodeURIComponent(s.id)}">${escapeHtml(s.name)}</a></td>
<td>${escapeHtml(s.team)}</td><td>${escapeHtml(s.state)}</td><td>${escapeHtml(s.nodeId)}</td>
<td>${escapeHtml(s.template)}</td><td>${escapeHtml(s.createdAt)}</td><td>${
      escapeHtml(s.lastActiveAt)
    }</td></tr>`
  ).join("");
  const link = (p: number, text: string) => {
    const q = new URLSearchParams();
    for (const k of ["team", "state", "node"] as const) {
      const v = view.filters[k];
      if (v !== undefined) q.set(k, v);
    }
    q.set("page", String(p));
    return `<a href="/ui?${escapeHtml(q.toString())}">${text}</a>`;
  };
  return `${warn}<table><thead><tr><th>Name</th><th>Team</th><th>State</th><th>Node</th><th>Template</th>
<th>Created</th><th>Last active</th></tr></thead><tbody>${body}</tbody></table>
<div class="pager"><span class="muted">${total} sandbox${
    total === 1 ? "" : "es"
  }, page ${page} of ${pages}</span>${page > 1 ? link(page - 1, "← newer") : ""}${
    page < pages ? link(page + 1, "older →") : ""
  }</div>`;
}

function placementsTable(list: PlacementRecord[], now: number): string {
  if (list.length === 0) return '<p class="muted">No placement since the gateway started.</p>';
  const rows = list.map((p) => {
    const e = p.explain;
    const rejected = e.rejections.length === 0
      ? '<span class="muted">none</span>'
      : e.rejections.map((r) =>
        `<div><b>${escapeHtml(r.nodeId)}</b>: ${escapeHtml(r.detail)}</div>`
      ).join("") + (Object.values(e.rejected).reduce((a, b) => a + b, 0) > e.rejections.length
        ? '<div class="muted">and more</div>'
        : "");
    const scores = e.scores.map((s) =>
      `<div>${escapeHtml(s.nodeId)} <span class="num">${
        s.score.toFixed(2)
      } = (${s.active} + ${s.inFlight}) / ${s.cores}</span></div>`
    ).join("");
    return `<tr><td>${age(now - p.at)}</td><td><code>${escapeHtml(p.key)}</code></td>
<td>${p.ok ? `on <b>${escapeHtml(p.nodeId)}</b>` : '<span class="error">nothing fits</span>'}</td>
<td>${e.feasible} of ${e.considered}</td><td>${rejected}</td><td>${
      scores || '<span class="muted">—</span>'
    }</td></tr>`;
  }).join("");
  return `<table><thead><tr><th>When</th><th>Name</th><th>Outcome</th><th>Feasible</th><th>Rejected</th>
<th>Best scores</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function meter(value: number, max: number): string {
  return `<meter class="gauge" min="0" max="${max}" value="${
    Math.max(0, Math.min(value, max))
  }" low="${max * 0.7}" high="${max * 0.9}" optimum="0"></meter>`;
}

function bytes(n: number): string {
  if (n >= 1e12) return `${(n / 1e12).toFixed(1)} TB`;
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(0)} MB`;
  return `${(n / 1e3).toFixed(0)} kB`;
}

function age(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}
