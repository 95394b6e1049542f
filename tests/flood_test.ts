/**
 * A descriptor flood against the real daemons: under the usual 1024 open-file limit, 1,100 idle
 * TCP connections (no token, not a byte sent) must neither end the gateway or a node nor keep
 * them from answering once the flood stops.
 */
import assert from "node:assert/strict";
import { startGateway } from "./_gateway.ts";
import { startNode } from "./_processes.ts";

const LIMIT = 1024;
const FLOOD = 1100;

/** Opens `n` idle connections to `port` and keeps them open; each one reads what comes. */
async function flood(port: number, n: number): Promise<Deno.TcpConn[]> {
  const conns: Deno.TcpConn[] = [];
  for (let i = 0; i < n; i++) {
    // The kernel completes the handshake from the listen queue even while the server cannot
    // accept, so every connect succeeds and holds a slot on the server's side once accepted.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    conns.push(conn);
    void (async () => {
      const buf = new Uint8Array(256);
      try {
        while (await conn.read(buf) !== null) { /* drain */ }
      } catch { /* reset by the server: it shed us */ }
    })();
  }
  return conns;
}

function closeAll(conns: Deno.TcpConn[]) {
  for (const c of conns) {
    try {
      c.close();
    } catch { /* the server closed it already */ }
  }
}

async function waitFor(what: string, ok: () => boolean, ms: number) {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** `GET /healthz` with a bound; the status, or the error's message. */
async function health(url: string, ms = 10_000): Promise<number | string> {
  try {
    const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(ms) });
    await res.body?.cancel();
    return res.status;
  } catch (error) {
    return (error as Error).message;
  }
}

for (const who of ["gateway", "node"] as const) {
  Deno.test(`the ${who} survives ${FLOOD} idle connections under a ${LIMIT}-descriptor limit and answers after`, async () => {
    const server = who === "gateway"
      ? await startGateway({ maxOpenFiles: LIMIT })
      : await startNode({ maxOpenFiles: LIMIT });
    const conns: Deno.TcpConn[] = [];
    try {
      conns.push(...await flood(server.port, FLOOD));
      // The precondition: the flood really ran the process out of descriptors. Without this
      // the test would pass on a machine whose limit the flood never reached.
      await waitFor(
        "the daemon reporting descriptor exhaustion",
        () => server.process.stderr().includes("out of file descriptors"),
        15_000,
      );
      // While the flood is still open: idle connections are shed to make room, so a client gets in.
      assert.equal(await health(server.url), 200, "no answer while the flood was open");
      closeAll(conns.splice(0));
      // After the flood, at once (bounded well under any idle timeout).
      assert.equal(await health(server.url, 2_000), 200, "no answer right after the flood");
      const exited = await Promise.race([
        server.process.child.status.then(() => true),
        new Promise<false>((r) => setTimeout(() => r(false), 50)),
      ]);
      assert.equal(exited, false, `the ${who} exited:\n${server.process.stderr().slice(-2000)}`);
    } finally {
      closeAll(conns);
      await server.stop();
    }
  });
}
