/**
 * Light stub nodes for the lookup and burst benchmarks: `count` listeners in one process, each
 * with its own sandboxes, answering the native verbs the gateway calls (lookupSandbox,
 * acquireSandbox, getSandboxMetrics). Prints `{"ports":[...]}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/children/stub_nodes.ts 200
 *
 * @module
 */
const count = Number(Deno.args[0] ?? "1");
const servers: Deno.HttpServer[] = [];
const ports: number[] = [];

interface StubSandbox {
  id: string;
  name: string;
  state: "active";
}

function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

for (let i = 0; i < count; i++) {
  const byName = new Map<string, StubSandbox>();
  const byId = new Map<string, StubSandbox>();
  let creates = 0;
  let seq = 0;
  let port = 0;
  const handler = async (req: Request): Promise<Response> => {
    const path = new URL(req.url).pathname;
    if (req.method === "GET" && path === "/healthz") return json({ ok: true });
    if (req.method === "GET" && path === "/stats") return json({ creates, sandboxes: byName.size });
    if (req.method === "POST" && path === "/reset") {
      byName.clear();
      byId.clear();
      creates = 0;
      return json({ ok: true });
    }
    const body = req.method === "POST" ? await req.json().catch(() => ({})) : {};
    if (path === "/lookupSandbox") {
      const s = body.name !== undefined ? byName.get(body.name) : byId.get(body.id);
      return json(s ? { found: true, sandbox: s } : { found: false });
    }
    if (path === "/acquireSandbox") {
      let s = byName.get(body.name);
      const created = s === undefined;
      if (s === undefined) {
        s = { id: `sb-${port}-${++seq}`, name: body.name, state: "active" };
        byName.set(s.name, s);
        byId.set(s.id, s);
        creates++;
      }
      const now = new Date().toISOString();
      return json({
        status: "ready",
        created,
        sandbox: {
          ...s,
          nodeId: `stub-${port}`,
          endpoint: `http://127.0.0.1:${port}`,
          template: "base",
          metadata: {},
          spec: {},
          createdAt: now,
          lastActiveAt: now,
        },
      });
    }
    if (path === "/getSandboxMetrics") {
      return json({ name: body.name, cpuUsedPct: 1, memoryUsedBytes: 1024 });
    }
    return json({ message: `No route ${req.method} ${path} on this stub` }, 404);
  };
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
  port = (server.addr as Deno.NetAddr).port;
  servers.push(server);
  ports.push(port);
}

console.log(JSON.stringify({ ports }));
const stop = async () => {
  await Promise.all(servers.map((s) => s.shutdown()));
  Deno.exit(0);
};
Deno.addSignalListener("SIGTERM", stop);
Deno.addSignalListener("SIGINT", stop);
