/**
 * The egress proxy's byte plumbing: reading a connection's head within its bounds, writing all
 * of a buffer, splicing two connections together, and connecting upstream within a bound.
 *
 * @module
 */

/** Most bytes read before the name is known (a TLS hello record, an HTTP request head). */
export const MAX_HEAD = 16 * 1024 + 5;
/** How long a sandbox has to send its hello or request head, ms. */
const HEAD_TIMEOUT_MS = 10_000;
/** How long a connection upstream may take, ms. */
const CONNECT_TIMEOUT_MS = 10_000;

export function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* closed already */ }
}

export async function writeAll(conn: Deno.Conn, data: Uint8Array): Promise<void> {
  let off = 0;
  while (off < data.length) off += await conn.write(data.subarray(off));
}

/** Copies `from` to `to` until `from` ends, then half-closes `to`. */
async function pump(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(64 * 1024);
  try {
    for (;;) {
      const n = await from.read(buf);
      if (n === null) break;
      await writeAll(to, buf.subarray(0, n));
    }
  } catch { /* either side gone: the other is closed below */ }
  try {
    await to.closeWrite();
  } catch { /* closed already */ }
}

/** Copies both ways between `a` and `b` until both ends are done, then closes both. */
export async function splice(a: Deno.Conn, b: Deno.Conn): Promise<void> {
  await Promise.all([pump(a, b), pump(b, a)]);
  for (const c of [a, b]) {
    try {
      c.close();
    } catch { /* closed already */ }
  }
}

/** A TCP connection to `ip:port` within the connect bound. */
export async function connectWithin(ip: string, port: number): Promise<Deno.TcpConn> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const attempt = Deno.connect({ hostname: ip, port }).then((c) => {
    c.setNoDelay(true);
    return c;
  });
  try {
    return await Promise.race([
      attempt,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${CONNECT_TIMEOUT_MS} ms`)),
          CONNECT_TIMEOUT_MS,
        );
      }),
    ]);
  } catch (error) {
    attempt.then((c) => c.close(), () => {});
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/** Reads what `conn` sends until `parse` knows its answer, within the head bounds. */
export async function readHead<T>(
  conn: Deno.Conn,
  parse: (data: Uint8Array) => T | null,
): Promise<{ data: Uint8Array; value: T } | null> {
  const buf = new Uint8Array(MAX_HEAD);
  let have = 0;
  const timer = setTimeout(() => {
    try {
      conn.close();
    } catch { /* closed already */ }
  }, HEAD_TIMEOUT_MS);
  try {
    while (have < MAX_HEAD) {
      const n = await conn.read(buf.subarray(have));
      if (n === null) return null;
      have += n;
      const data = buf.subarray(0, have);
      const value = parse(data);
      if (value !== null) return { data, value };
    }
    return null;
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}
