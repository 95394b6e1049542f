/**
 * A unix-socket proxy in front of the Docker engine, run as its own process so a test can lose
 * the engine without touching the real dockerd (other suites share it). Arguments: the socket
 * to listen on, the engine's socket. Prints `ready` once it listens. SIGUSR1 drops every
 * connection open at that moment (the streams of running commands with them) while new ones
 * still reach the engine; SIGTERM or SIGKILL ends it, and with it the engine as the node sees
 * it.
 *
 * Needs `--allow-net=unix:<both>`, `--allow-read` and `--allow-write` on both sockets.
 *
 * @module
 */
const [path, enginePath] = Deno.args;
try {
  Deno.removeSync(path);
} catch { /* no stale socket */ }
const listener = Deno.listen({ transport: "unix", path });
const open = new Set<Deno.Conn>();

function drop(conn: Deno.Conn): void {
  open.delete(conn);
  try {
    conn.close();
  } catch { /* closed already */ }
}

/**
 * Copies `from` to `to`. The end of `from` half-closes `to` (the executor ends a command's
 * stdin that way, and the engine must keep sending its output), unless `whole` says it ends
 * the pair. Plain reads and writes, not the streams: closing a connection's writable stream
 * closes the whole connection, where `closeWrite()` closes one direction.
 */
async function copy(from: Deno.Conn, to: Deno.Conn, whole: boolean): Promise<void> {
  const buffer = new Uint8Array(64 * 1024);
  try {
    for (;;) {
      const n = await from.read(buffer);
      if (n === null) break;
      for (let at = 0; at < n;) at += await to.write(buffer.subarray(at, n));
    }
    if (!whole) {
      await to.closeWrite();
      return;
    }
  } catch { /* one side dropped */ }
  drop(from);
  drop(to);
}

Deno.addSignalListener("SIGUSR1", () => {
  for (const conn of [...open]) drop(conn);
});
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));

console.log("ready");
for await (const client of listener) {
  let engine: Deno.Conn;
  try {
    engine = await Deno.connect({ transport: "unix", path: enginePath });
  } catch {
    client.close();
    continue;
  }
  open.add(client).add(engine);
  void copy(client, engine, false);
  void copy(engine, client, true);
}
