/**
 * A small client of the V8 inspector a process started with `--inspect=host:port` opens, for
 * the benches that read a running gateway's own memory figures: `Deno.memoryUsage()` evaluated
 * inside it, before and after a full collection.
 *
 * @module
 */

/** `Deno.memoryUsage()` of the inspected process, in bytes. */
export interface MemoryUsage {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  external: number;
}

/** One inspector session over its WebSocket; every call is bounded by `timeoutMs`. */
export class Inspector {
  readonly #ws: WebSocket;
  readonly #pending = new Map<number, (result: unknown) => void>();
  #next = 0;

  private constructor(ws: WebSocket) {
    this.#ws = ws;
    ws.onmessage = (e) => {
      const m = JSON.parse(String(e.data)) as { id?: number; result?: unknown };
      const done = m.id === undefined ? undefined : this.#pending.get(m.id);
      if (done === undefined) return;
      this.#pending.delete(m.id!);
      done(m.result);
    };
  }

  /** Opens a session to the first target of the inspector at `port` on 127.0.0.1. */
  static async connect(port: number, timeoutMs = 10_000): Promise<Inspector> {
    const res = await fetch(`http://127.0.0.1:${port}/json/list`, {
      signal: AbortSignal.timeout(timeoutMs),
    });
    const targets = await res.json() as { webSocketDebuggerUrl: string }[];
    if (targets.length === 0) throw new Error(`The inspector at ${port} lists no target`);
    const ws = new WebSocket(targets[0].webSocketDebuggerUrl);
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the inspector did not open")), timeoutMs);
      ws.onopen = () => {
        clearTimeout(timer);
        resolve();
      };
      ws.onerror = () => {
        clearTimeout(timer);
        reject(new Error(`the inspector's WebSocket at ${port} failed`));
      };
    });
    return new Inspector(ws);
  }

  /** Sends one protocol method and waits for its result (or fails after `timeoutMs`). */
  call(method: string, params: unknown = {}, timeoutMs = 30_000): Promise<unknown> {
    const id = ++this.#next;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`the inspector did not answer ${method} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#pending.set(id, (result) => {
        clearTimeout(timer);
        resolve(result);
      });
      this.#ws.send(JSON.stringify({ id, method, params }));
    });
  }

  /** `Deno.memoryUsage()` inside the process; after a full collection when `collect`. */
  async memory(collect: boolean): Promise<MemoryUsage> {
    if (collect) await this.call("HeapProfiler.collectGarbage");
    const r = await this.call("Runtime.evaluate", {
      expression: "JSON.stringify(Deno.memoryUsage())",
    }) as { result: { value: string } };
    return JSON.parse(r.result.value) as MemoryUsage;
  }

  /** Closes the session. */
  close(): void {
    this.#ws.close();
  }
}
