/**
 * The node's two sandbox networks and the sandbox port addresses on them. A sandbox without
 * egress sits on `dormice-<node>-internal` (`--internal`: no route out); one that asked for egress
 * sits on `dormice-<node>-egress` (a route out through the host's NAT). Both are made with
 * inter-container communication off (`com.docker.network.bridge.enable_icc=false`), so no sandbox
 * reaches another, whatever its team or network, as in E2B. The node (on the host) still reaches
 * every sandbox's ports: its connections leave the host into the bridge, which that rule does not
 * stop.
 *
 * @module
 */
import { ExecutorError, type PortAddress } from "../contract.ts";
import type { Log } from "../../../shared/log.ts";
import type { Engine } from "./engine.ts";

/** Most sandbox addresses remembered; past it the oldest is looked up again on its next use. */
const MAX_REMEMBERED = 10_000;

/** The bridge driver's option for inter-container traffic. */
const ICC = "com.docker.network.bridge.enable_icc";

type Kind = "internal" | "egress";

/** The fields of a network inspect read here. */
interface NetworkInspect {
  Internal?: boolean;
  Options?: Record<string, string>;
  Containers?: Record<string, unknown>;
}

/** One of the node's networks. */
interface NodeNetwork {
  kind: Kind;
  /** `dormice-<node>-<kind>`. */
  name: string;
  /** Made (or found) and checked. */
  ready?: Promise<void>;
}

/** Options of {@linkcode SandboxNetwork}. */
export interface SandboxNetworkOptions {
  engine: Engine;
  /** The node's id as it may appear in names (`nameSafe`). */
  nodeName: string;
  log: Log;
}

/** The node's sandbox networks, made on first use, and where each sandbox sits on them. */
export class SandboxNetwork {
  /** The internal network's name, `dormice-<node>-internal`. */
  readonly name: string;
  /** The egress network's name, `dormice-<node>-egress`. */
  readonly egressName: string;
  #engine: Engine;
  #log: Log;
  #internal: NodeNetwork;
  #egress: NodeNetwork;
  #addresses = new Map<string, string>();

  constructor({ engine, nodeName, log }: SandboxNetworkOptions) {
    this.#engine = engine;
    this.#log = log;
    this.#internal = { kind: "internal", name: `dormice-${nodeName}-internal` };
    this.#egress = { kind: "egress", name: `dormice-${nodeName}-egress` };
    this.name = this.#internal.name;
    this.egressName = this.#egress.name;
  }

  /**
   * The network a new container joins: the egress one with egress, the internal one without,
   * made now if it does not exist yet.
   *
   * @throws {ExecutorError} `unavailable` when the network cannot be made isolated.
   */
  async modeFor(egress: boolean): Promise<string> {
    const network = egress ? this.#egress : this.#internal;
    network.ready ??= this.#ensure(network).catch((error) => {
      // A failure is retried by the next create rather than remembered for ever.
      network.ready = undefined;
      throw error;
    });
    await network.ready;
    return network.name;
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
      // `bridge`: a sandbox with egress made before the node had its own egress network.
      ip = networks[this.name]?.IPAddress || networks[this.egressName]?.IPAddress ||
        networks.bridge?.IPAddress ||
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
   * Removes the networks this executor used when no container is left on them (the engine
   * refuses while one is, which is then no error: the network stays for the sandboxes on it,
   * and the next start finds it). Docker has address pools for about thirty such networks, so
   * a node that leaves for good must not keep them.
   */
  async release(): Promise<void> {
    for (const network of [this.#internal, this.#egress]) {
      // Only a network this executor used: another executor with the same node id (a cleanup
      // helper beside a live node) must not pull it from under the node's next create.
      if (network.ready === undefined) continue;
      network.ready = undefined;
      await this.#remove(network);
    }
  }

  /**
   * Removes both networks of this node id, whether or not this executor used them, where no
   * container is left on them: the cleanup after a node that was killed.
   */
  async removeAll(): Promise<void> {
    for (const network of [this.#internal, this.#egress]) {
      network.ready = undefined;
      await this.#remove(network);
    }
  }

  /** Drops a destroyed sandbox's address. */
  forget(id: string): void {
    this.#addresses.delete(id);
  }

  /** Removes `network` if no container sits on it. */
  async #remove(network: NodeNetwork): Promise<void> {
    await this.#engine.call(
      `removing network ${network.name}`,
      (signal) => this.#engine.client.getNetwork(network.name).remove({ abortSignal: signal }),
    ).catch(() => {});
  }

  async #inspect(network: NodeNetwork): Promise<NetworkInspect | null> {
    try {
      return await this.#engine.call(
        `inspecting network ${network.name}`,
        (signal) => this.#engine.client.getNetwork(network.name).inspect({ abortSignal: signal }),
      ) as NetworkInspect;
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") return null;
      throw error;
    }
  }

  /**
   * Makes `network` unless it exists with the isolation asked of it; one made without it (by a
   * node from before inter-container traffic was turned off, or by hand) is made again when
   * empty and refused while sandboxes sit on it.
   */
  async #ensure(network: NodeNetwork): Promise<void> {
    let inspect = await this.#inspect(network);
    if (inspect && !isolated(inspect, network.kind)) {
      const held = Object.keys(inspect.Containers ?? {}).length;
      if (held > 0) throw notIsolated(network, held);
      this.#log("warn", "Sandbox network without isolation found empty: made again", {
        network: network.name,
      });
      await this.#remove(network);
      inspect = null;
    }
    if (inspect === null) {
      try {
        await this.#engine.call(
          `creating network ${network.name}`,
          (signal) =>
            this.#engine.client.createNetwork({
              Name: network.name,
              Internal: network.kind === "internal",
              CheckDuplicate: true,
              Options: { [ICC]: "false" },
              Labels: { "dormice.network": network.kind },
              abortSignal: signal,
            }),
        );
      } catch (error) {
        // Another node process on this engine made it first: it is just as good.
        if (!(error instanceof ExecutorError && error.code === "exists")) throw error;
      }
      inspect = await this.#inspect(network);
      if (inspect === null) {
        throw new ExecutorError(
          "unavailable",
          `Network ${network.name} was made and is gone again (removed by another process?): ` +
            "create the sandbox again",
        );
      }
    }
    // Someone else's network by this name, or an old one that did not leave: never used as is.
    if (!isolated(inspect, network.kind)) {
      throw notIsolated(network, Object.keys(inspect.Containers ?? {}).length);
    }
  }
}

/** The refusal for a network by the node's name that lacks the isolation it needs. */
function notIsolated(network: NodeNetwork, held: number): ExecutorError {
  const lacks = `${ICC}=false${network.kind === "internal" ? " or --internal" : ""}`;
  return new ExecutorError(
    "unavailable",
    `Network ${network.name} lets its sandboxes reach each other (it was made without ${lacks}) ` +
      `and ${held} container(s) still sit on it: destroy the sandboxes on it (docker network ` +
      `inspect ${network.name} lists them), and the node makes it again, isolated`,
  );
}

/** Whether a network has the isolation the node asks of one of its `kind`. */
function isolated(inspect: NetworkInspect, kind: Kind): boolean {
  return inspect.Options?.[ICC] === "false" && (kind !== "internal" || inspect.Internal === true);
}
