/**
 * The node's two sandbox networks and the sandbox port addresses on them. A sandbox without
 * egress sits on `dormice-<node>-internal` (`--internal`: no route out); one that asked for egress
 * sits on `dormice-<node>-egress` (a route out through the host's NAT). Both are made with
 * inter-container communication off (`com.docker.network.bridge.enable_icc=false`), so no sandbox
 * reaches another, whatever its team or network, as in E2B; and, unless the host firewall is off,
 * each bridge gets the INPUT rule of `_firewall.ts`, so no sandbox reaches the host either. The
 * node (on the host) still reaches every sandbox's ports: its connections leave the host into the
 * bridge, which neither rule stops, and their replies are let back in.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { ExecutorError, type PortAddress } from "../contract.ts";
import type { Log } from "../../../shared/log.ts";
import type { Engine } from "./engine.ts";
import type { HostFirewall } from "./_firewall.ts";
import type { EgressFirewall } from "./_egress.ts";

/** Most sandbox addresses remembered; past it the oldest is looked up again on its next use. */
const MAX_REMEMBERED = 10_000;

/** The bridge driver's options: the bridge's interface name, and inter-container traffic. */
const BRIDGE_NAME = "com.docker.network.bridge.name";
const ICC = "com.docker.network.bridge.enable_icc";

type Kind = "internal" | "egress";

/** The fields of a network inspect read here. */
interface NetworkInspect {
  Id?: string;
  Internal?: boolean;
  Options?: Record<string, string>;
  Containers?: Record<string, unknown>;
}

/** One of the node's networks: its names and, once made, its bridge. */
interface NodeNetwork {
  kind: Kind;
  /** `dormice-<node>-<kind>`. */
  name: string;
  /**
   * The bridge's interface name this node asks for: `dm-` + ten hex digits of the node name's
   * hash + the kind's initial (15 characters, the kernel's limit). Fixed per node, so a node
   * that makes its network again finds its firewall rule again rather than leave one behind.
   */
  bridge: string;
  /** Made (or found) and checked, resolving to the bridge's actual name. */
  ready?: Promise<string>;
  /** The host rule was seen in place once by this process. */
  guarded?: boolean;
  /**
   * The check of this network's rule running now. Checks never overlap, since two that both
   * found the rule missing would both insert it.
   */
  guarding?: Promise<void>;
  /**
   * The check waiting for `guarding` to end: every create that arrives meanwhile shares it,
   * so creates at once cost two checks rather than one each in a row.
   */
  nextGuard?: Promise<void>;
}

/** Options of {@linkcode SandboxNetwork}. */
export interface SandboxNetworkOptions {
  engine: Engine;
  /** The node's id as it may appear in names (`nameSafe`). */
  nodeName: string;
  /** The host firewall; `null` when it is off (`DORMICE_SANDBOX_HOST_FIREWALL=off`). */
  firewall: HostFirewall | null;
  /** The sandboxes' egress rules; `null` when the node enforces none. */
  egress?: EgressFirewall | null;
  log: Log;
}

/** The node's sandbox networks, made on first use, and where each sandbox sits on them. */
export class SandboxNetwork {
  /** The internal network's name, `dormice-<node>-internal`. */
  readonly name: string;
  /** The egress network's name, `dormice-<node>-egress`. */
  readonly egressName: string;
  #engine: Engine;
  #firewall: HostFirewall | null;
  #egressRules: EgressFirewall | null;
  #log: Log;
  #internal: NodeNetwork;
  #egress: NodeNetwork;
  #addresses = new Map<string, string>();

  constructor({ engine, nodeName, firewall, egress = null, log }: SandboxNetworkOptions) {
    this.#engine = engine;
    this.#firewall = firewall;
    this.#egressRules = egress;
    this.#log = log;
    const hash = createHash("sha256").update(nodeName).digest("hex").slice(0, 10);
    const network = (kind: Kind): NodeNetwork => ({
      kind,
      name: `dormice-${nodeName}-${kind}`,
      bridge: `dm-${hash}-${kind[0]}`,
    });
    this.#internal = network("internal");
    this.#egress = network("egress");
    this.name = this.#internal.name;
    this.egressName = this.#egress.name;
  }

  /**
   * Checks, at boot, that the host firewall can be managed (nothing to check when it is off).
   *
   * @throws {ExecutorError} `unavailable` naming what failed and the ways out.
   */
  async checkFirewall(): Promise<void> {
    await this.#firewall?.check(this.#internal.bridge, this.#internal.name);
  }

  /**
   * The network a new container joins: the egress one with egress, the internal one without,
   * made now if it does not exist yet. Each call also confirms the bridge's host rule is in
   * place and puts it back if not: a firewall reload (ufw, firewalld) flushes INPUT, and no new
   * sandbox may start on a bridge without its rule.
   *
   * @throws {ExecutorError} `unavailable` when the network or its rule cannot be made.
   */
  async modeFor(egress: boolean): Promise<string> {
    const network = egress ? this.#egress : this.#internal;
    const bridge = await this.#bridgeOf(network);
    if (this.#firewall) await this.#guard(network, bridge, this.#firewall);
    return network.name;
  }

  /**
   * Confirms (or puts back) the host rule of `network`'s bridge for a create arriving now. A
   * check that started before the create arrived may have looked before a firewall reload, so
   * it is never shared: the create joins the check queued behind it (or queues one), which
   * starts after the create arrived. Creates at once thus wait for at most two checks, not for
   * one check each in a row.
   */
  #guard(network: NodeNetwork, bridge: string, firewall: HostFirewall): Promise<void> {
    if (network.nextGuard) return network.nextGuard;
    const check = async () => {
      if (await firewall.guard(bridge, network.name)) {
        this.#log(
          network.guarded ? "warn" : "info",
          network.guarded
            ? "The host firewall rule of a sandbox network was gone (a firewall reload?): put back"
            : "Host firewall rule installed for a sandbox network",
          { network: network.name, bridge },
        );
      }
      network.guarded = true;
    };
    const start = () => {
      const running = check();
      network.guarding = running;
      const clear = () => {
        if (network.guarding === running) network.guarding = undefined;
      };
      running.then(clear, clear);
      return running;
    };
    if (network.guarding === undefined) return start();
    const next = network.guarding.catch(() => {}).then(() => {
      network.nextGuard = undefined;
      return start();
    });
    network.nextGuard = next;
    return next;
  }

  /** `network` made (or found) and checked once per process; resolves to its bridge. */
  #bridgeOf(network: NodeNetwork): Promise<string> {
    network.ready ??= this.#ensure(network).catch((error) => {
      // A failure is retried by the next create rather than remembered for ever.
      network.ready = undefined;
      throw error;
    });
    return network.ready;
  }

  /**
   * Where a sandbox sits on the egress network: its address there, the network's bridge, which
   * its egress rules are keyed to, and the bridge's address (where the egress proxy listens). `null` for a sandbox not on it (made without egress,
   * or with egress before the node had its own egress network).
   *
   * @throws {ExecutorError} `gone` when the sandbox has no container.
   */
  async egressEndpoint(
    id: string,
  ): Promise<{ ip: string; bridge: string; gateway: string } | null> {
    const inspect = await this.#engine.callContainer(
      id,
      `inspecting the network of sandbox ${id}`,
      (container, signal) => container.inspect({ abortSignal: signal }),
    );
    const at = inspect.NetworkSettings?.Networks?.[this.egressName];
    if (!at?.IPAddress) return null;
    return {
      ip: at.IPAddress,
      bridge: await this.#bridgeOf(this.#egress),
      gateway: at.Gateway ?? "",
    };
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
   * Removes the networks this executor used, each with its host rule, when no container is left
   * on it (the engine refuses while one is, which is then no error: the network and its rule
   * stay for the sandboxes on it, and the next start finds both). Docker has address pools for
   * about thirty such networks, so a node that leaves for good must not keep them. Failures are
   * logged, not thrown: this runs while the node shuts down.
   */
  async release(): Promise<void> {
    for (const network of [this.#internal, this.#egress]) {
      // Only a network this executor used: another executor with the same node id (a cleanup
      // helper beside a live node) must not pull it from under the node's next create.
      const ready = network.ready;
      if (ready === undefined) continue;
      network.ready = undefined;
      network.guarded = false;
      const bridge = await ready.catch(() => undefined);
      if (bridge === undefined) continue;
      await this.#remove(network, bridge).catch((error) =>
        this.#log("warn", "Could not remove a sandbox network's host firewall rule", {
          network: network.name,
          bridge,
          error,
        })
      );
    }
  }

  /**
   * Removes both networks of this node id and their host rules, whether or not this executor
   * used them, where no container is left on them: the cleanup after a node that was killed.
   *
   * @throws {ExecutorError} when the engine or iptables fails.
   */
  async removeAll(): Promise<void> {
    for (const network of [this.#internal, this.#egress]) {
      network.ready = undefined;
      network.guarded = false;
      const inspect = await this.#inspect(network);
      await this.#remove(network, inspect ? bridgeOf(inspect) : network.bridge);
    }
  }

  /** Drops a destroyed sandbox's address. */
  forget(id: string): void {
    this.#addresses.delete(id);
  }

  /** Removes `network` if empty, then (removed or already gone) its host rule. */
  async #remove(network: NodeNetwork, bridge: string): Promise<void> {
    try {
      await this.#engine.call(
        `removing network ${network.name}`,
        (signal) => this.#engine.client.getNetwork(network.name).remove({ abortSignal: signal }),
      );
    } catch (error) {
      if (!(error instanceof ExecutorError && error.code === "not_found")) return;
    }
    // Egress rules of sandboxes that left behind the node's back: nothing sits on the bridge.
    const leftover = network.kind === "egress"
      ? await this.#egressRules?.removeBridge(bridge) ?? 0
      : 0;
    if (leftover > 0) {
      this.#log("info", "Egress rules of sandboxes gone from a removed network removed", {
        network: network.name,
        bridge,
        sandboxes: leftover,
      });
    }
    const removed = await this.#firewall?.unguard(bridge, network.name) ?? 0;
    if (removed > 0) {
      this.#log("info", "Sandbox network and its host firewall rule removed", {
        network: network.name,
        bridge,
      });
    }
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
   * empty and refused while sandboxes sit on it. With the firewall on, also checks that the
   * engine really keeps the bridge's containers apart. Resolves to the bridge's name.
   */
  async #ensure(network: NodeNetwork): Promise<string> {
    let inspect = await this.#inspect(network);
    if (inspect && !isolated(inspect, network.kind)) {
      const held = Object.keys(inspect.Containers ?? {}).length;
      if (held > 0) throw notIsolated(network, held);
      this.#log("warn", "Sandbox network without isolation found empty: made again", {
        network: network.name,
      });
      await this.#remove(network, bridgeOf(inspect));
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
              Options: { [BRIDGE_NAME]: network.bridge, [ICC]: "false" },
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
    const bridge = bridgeOf(inspect);
    await this.#firewall?.verifyNoInterContainer(bridge, network.name);
    return bridge;
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

/** A network's bridge interface: the name it was made with, else Docker's `br-<id>`. */
function bridgeOf(inspect: NetworkInspect): string {
  return inspect.Options?.[BRIDGE_NAME] || `br-${(inspect.Id ?? "").slice(0, 12)}`;
}
