/**
 * The fake executor's sandbox ports: a handler a test installs for `(sandbox, port)` is served on
 * a loopback listener of its own, so the node's port proxy reaches it over real TCP exactly as it
 * reaches a container (streamed bodies, WebSocket upgrades and hang-ups included).
 *
 * @module
 */
import type { PortAddress } from "./contract.ts";

/** What a fake sandbox port answers with: a `Deno.serve` handler. */
export type FakePortHandler = (request: Request) => Response | Promise<Response>;

interface Served {
  server: Deno.HttpServer<Deno.NetAddr>;
  address: PortAddress;
}

/** The listeners of every fake sandbox port, closed with their sandbox. */
export class FakePorts {
  readonly #served = new Map<string, Served>();

  /** Serves `handler` as `port` of sandbox `id`, replacing the one there; resolves once bound. */
  serve(id: string, port: number, handler: FakePortHandler): Promise<void> {
    this.#close(key(id, port));
    const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
    this.#served.set(key(id, port), {
      server,
      address: { hostname: "127.0.0.1", port: server.addr.port },
    });
    return Promise.resolve();
  }

  /** Stops serving one port: the proxy then finds nothing listening there. */
  stop(id: string, port: number): Promise<void> {
    return this.#close(key(id, port));
  }

  /** The listener of `port` in sandbox `id`, or `null` when nothing serves it. */
  address(id: string, port: number): PortAddress | null {
    return this.#served.get(key(id, port))?.address ?? null;
  }

  /** Closes every port of sandbox `id` (its destroy). */
  async closeSandbox(id: string): Promise<void> {
    const prefix = `${id}\u0000`;
    await Promise.all(
      [...this.#served.keys()].filter((k) => k.startsWith(prefix)).map((k) => this.#close(k)),
    );
  }

  /** Closes every listener. */
  async closeAll(): Promise<void> {
    await Promise.all([...this.#served.keys()].map((k) => this.#close(k)));
  }

  async #close(k: string): Promise<void> {
    const served = this.#served.get(k);
    if (served === undefined) return;
    this.#served.delete(k);
    // shutdown() waits for answers still streaming (an endless event stream): bounded.
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      served.server.shutdown().catch(() => {}),
      new Promise<void>((r) => timer = setTimeout(r, 1000)),
    ]);
    clearTimeout(timer);
  }
}

function key(id: string, port: number): string {
  return `${id}\u0000${port}`;
}
