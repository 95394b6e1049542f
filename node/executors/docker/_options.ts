/**
 * What a `DockerExecutor` is built from: its options, each with the default the executor
 * takes when it is absent (`executor.ts`).
 *
 * @module
 */
import type { Clock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import type { VolumeDecl } from "../../config_capabilities.ts";
import type { DockerLimits } from "./_containers.ts";
import type { DockerEngine } from "./engine.ts";
import type { IptablesRunner } from "./_firewall.ts";
import type { EgressCa } from "./_egress_ca.ts";

/** Options for {@link DockerExecutor}. */
export interface DockerExecutorOptions {
  /** This node's id, written on every container as the `dormice.node` label. */
  nodeId: string;
  /**
   * What this executor owns its containers by (the `dormice.instance` label, and its internal
   * network's name): the node's `Ledger.instanceId`, so a restarted node finds its containers
   * and a node with the same id on the same engine never lists or removes them. A random one,
   * for this object only, when absent.
   */
  instanceId?: string;
  /** The engine client (a dockerode `Docker`); one on `socketPath` by default. */
  docker?: DockerEngine;
  /** The engine socket (for the client and for error sentences). */
  socketPath?: string;
  /** Template name to image; `parseTemplates(DEFAULT_TEMPLATES)` by default. */
  templates?: Map<string, string>;
  /** Limits for specs that do not set them. */
  defaults?: Partial<DockerLimits>;
  /** Deadline of one ordinary engine call, ms (inspect, exec create, pause, ...). */
  callTimeoutMs?: number;
  /**
   * Deadline of creating and starting a container, ms (the engine may be busy unpacking), and
   * of the image's start command (its `dormice.start` label), if it has one.
   */
  createTimeoutMs?: number;
  /** Deadline of a file transfer or a helper command (stat, list, mkdir, ...), ms. */
  fileTimeoutMs?: number;
  /**
   * How often a directory watch looks for changes made by commands, ms (250 by default: a
   * `find` + `stat` of the directory each time, in the sandbox's own CPU share). Changes made
   * through the file verbs are seen before the verb answers, whatever this is.
   */
  watchIntervalMs?: number;
  /** Run containers under docker-init so orphaned processes are reaped (needs the engine's init). */
  init?: boolean;
  /** Time source for stats timestamps and written files' times. */
  clock?: Clock;
  /** Where the executor logs a missing image, a failed stream or a kill that did not land. */
  log?: Log;
  /** Named volumes a create may mount (`DORMICE_VOLUMES`). */
  volumes?: VolumeDecl[];
  /**
   * The node's managed volumes (E2B `Volume`): the host directory a create mounts for one, by
   * its id, or `undefined` when the node does not hold it. Bind-mounted read-write.
   */
  managedVolumes?: (name: string) => string | undefined;
  /**
   * Whether each sandbox network's bridge gets the host rule that drops every connection a
   * sandbox opens to this machine (`_firewall.ts`); true by default. It needs iptables, root and
   * `--allow-run=iptables`; `connect()` refuses without them. Off
   * (`DORMICE_SANDBOX_HOST_FIREWALL=off`), sandboxes reach every service listening on the host,
   * and the executor enforces no egress address rules either (its capabilities say so).
   */
  hostFirewall?: boolean;
  /** Runs iptables for the host firewall; the real binary by default (tests pass a fake). */
  runIptables?: IptablesRunner;
  /**
   * The fleet egress CA (`_egress_ca.ts`): with it (and the host firewall on) the executor
   * serves domain rules and header transforms through its egress proxy, and every sandbox with
   * egress trusts the CA. Without it, rules that name a domain are refused.
   */
  egressCa?: EgressCa | null;
  /** More CA certificates (PEM) the proxy trusts upstream (`DORMICE_EGRESS_EXTRA_CA`). */
  egressExtraCa?: string[];
  /** Names the proxy resolves to these addresses rather than asking DNS (`DORMICE_EGRESS_HOSTS`). */
  egressHosts?: ReadonlyMap<string, string>;
  /**
   * The DNS servers a sandbox with egress asks (`DORMICE_SANDBOX_DNS`): the engine's resolver in
   * the sandbox forwards to them instead of the host's. The engine's choice when empty.
   */
  sandboxDns?: string[];
}

/** 16 random hex digits: an instance of its own for an executor given none. */
export function randomInstanceId(): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(8)),
    (b) => b.toString(16).padStart(2, "0"),
  )
    .join("");
}
