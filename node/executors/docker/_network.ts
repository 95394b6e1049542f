/**
 * The node's internal Docker network and the sandbox port addresses on it. A sandbox without
 * egress sits on this network only: created with `--internal`, it has no route out, yet the
 * node (on the host) reaches every container's ports on it. A sandbox that asked for egress
 * sits on Docker's `bridge` instead, where the host reaches it just the same.
 *
 * @module
 */
import { ExecutorError, type PortAddress } from "../contract.ts";
import type { Engine } from "./engine.ts";

/** Most sandbox addresses remembered; past it the oldest is looked up again on its next use. */
const MAX_REMEMBERED = 10_000;

/** The node's internal network, made on first use, and where each sandbox sits on it. */
export class SandboxNetwork {
  /** The internal network's name, `dormice-<node>-internal`. */
  readonly name: string;
  #engine: Engine;
  #ready: Promise<void> | undefined;
  #addresses = new Map<string, string>();

  constructor(engine: Engine, nodeName: string) {
    this.#engine = engine;
    this.name = `dormice-${nodeName}-internal`;
  }

  /**
   * The network a new container joins: `bridge` with egress, the internal network (made now if
   * it does not exist yet) without.
   */
  async modeFor(egress: boolean): Promise<string> {
    if (egress) return "bridge";
    this.#ready ??= this.#ensure().catch((error) => {
      // A failure is retried by the next create rather than remembered for ever.
      this.#ready = undefined;
      throw error;
    });
    await this.#ready;
    return this.name;
  }

  /**
   * The sandbox's address for `port`: its IP on the network it sits on, from memory or from an
   * inspect. `null` for a container on no network (made before ports existed, `network none`).
   *
   * @throws {ExecutorError} `gone` when the sandbox has no container.
   */
  async address(id: string, port: number): Promise<PortAddress | null> {
    let ip = this.#addresses.get(id);
    if (ip === undefined) {
      const inspect = await this.#engine.callContainer(
        id,
        `inspecting the network of sandbox ${id}`,
        (container, signal) => container.inspect({ abortSignal: signal }),
      );
      const networks = inspect.NetworkSettings?.Networks ?? {};
      ip = networks[this.name]?.IPAddress || networks.bridge?.IPAddress ||
        Object.values(networks).find((n) => n.IPAddress)?.IPAddress || "";
      if (ip === "") return null;
      if (this.#addresses.size >= MAX_REMEMBERED) {
        this.#addresses.delete(this.#addresses.keys().next().value!);
      }
      this.#addresses.set(id, ip);
    }
    return { hostname: ip, port };
  }

  /**
   * Removes the internal network when no container is left on it (the engine refuses while one
   * is, which is then no error). Docker has address pools for about thirty such networks, so a
   * node that leaves for good must not keep one.
   */
  async release(): Promise<void> {
    // Only an executor that used it: another one with the same node id (a cleanup helper beside
    // a live node) must not pull the network from under the node's next create.
    if (this.#ready === undefined) return;
    this.#ready = undefined;
    await this.#engine.call(
      `removing network ${this.name}`,
      (signal) => this.#engine.client.getNetwork(this.name).remove({ abortSignal: signal }),
    ).catch(() => {});
  }

  /** Drops a destroyed sandbox's address. */
  forget(id: string): void {
    this.#addresses.delete(id);
  }

  async #ensure(): Promise<void> {
    try {
      await this.#engine.call(
        `inspecting network ${this.name}`,
        (signal) => this.#engine.client.getNetwork(this.name).inspect({ abortSignal: signal }),
      );
      return;
    } catch (error) {
      if (!(error instanceof ExecutorError && error.code === "not_found")) throw error;
    }
    try {
      await this.#engine.call(
        `creating network ${this.name}`,
        (signal) =>
          this.#engine.client.createNetwork({
            Name: this.name,
            Internal: true,
            CheckDuplicate: true,
            Labels: { "dormice.network": "internal" },
            abortSignal: signal,
          }),
      );
    } catch (error) {
      // Another node process on this engine made it first: it is just as good.
      if (!(error instanceof ExecutorError && error.code === "exists")) throw error;
    }
  }
}
