/**
 * A container made ready before it is handed out, whether built or restored: the fleet egress
 * CA in its trust store, its egress address rules in the kernel (`_egress.ts`) with its
 * connections steered to the egress proxy where its rules need one (`_egress_proxy.ts`), then
 * its image's start command (its `dormice.start` label). The same rules are replaced while it
 * runs (`setEgressRules`). `DockerExecutor` delegates these steps here.
 *
 * @module
 */
import { type CreateRequest, ExecutorError, noEgress } from "../contract.ts";
import {
  type EgressRules,
  needsEgressProxy,
  transformPorts,
} from "../../../shared/egress_rules.ts";
import type { Commands } from "./_exec.ts";
import type { SandboxNetwork } from "./_network.ts";
import type { EgressFirewall } from "./_egress.ts";
import type { EgressCa } from "./_egress_ca.ts";
import { type EgressProxy, PortListenersFull } from "./_egress_proxy.ts";

/** What {@link SandboxSetup} works with. */
export interface SandboxSetupOptions {
  /** Runs the start command and the CA's install in the sandbox. */
  commands: Commands;
  /** Where each sandbox's egress endpoint is found. */
  network: SandboxNetwork;
  /** The kernel rules; `null` when the host firewall is off (no rules served). */
  egress: EgressFirewall | null;
  /** The egress proxy; `null` without an egress CA or the host firewall. */
  proxy: EgressProxy | null;
  /** The fleet egress CA every sandbox with egress trusts; `null` for none. */
  egressCa: EgressCa | null;
  /** Deadline of the start command and of the CA's install, ms. */
  startTimeoutMs: number;
}

/** The steps between a container made and a sandbox handed out, and its egress rules. */
export class SandboxSetup {
  #commands: Commands;
  #network: SandboxNetwork;
  #egress: EgressFirewall | null;
  #proxy: EgressProxy | null;
  #egressCa: EgressCa | null;
  #startTimeoutMs: number;

  /** Makes no engine call. */
  constructor(options: SandboxSetupOptions) {
    this.#commands = options.commands;
    this.#network = options.network;
    this.#egress = options.egress;
    this.#proxy = options.proxy;
    this.#egressCa = options.egressCa;
    this.#startTimeoutMs = options.startTimeoutMs;
  }

  /**
   * What a new container needs before it is handed out, whether built or restored: its egress
   * rules, then its image's start command. On a failure `undo` removes what was made, and the
   * failure is thrown.
   */
  async ready(
    request: CreateRequest,
    start: string | null,
    undo: () => Promise<unknown>,
  ): Promise<void> {
    const rules = request.spec.egressRules;
    const egress = request.spec.network === true || rules !== undefined;
    if (egress && this.#egressCa !== null) {
      try {
        await this.#trustEgressCa(request.id);
      } catch (error) {
        await undo().catch(() => {});
        throw error;
      }
    }
    if (rules !== undefined) {
      try {
        await this.applyEgress(request.id, rules, request.team);
      } catch (error) {
        await undo().catch(() => {});
        throw error;
      }
    }
    if (start === null) return;
    let failure: string | null = null;
    try {
      const result = await this.#commands.run(
        request.id,
        ["/bin/sh", "-c", start],
        undefined,
        this.#startTimeoutMs,
      );
      if (result.code !== 0) {
        const said = (result.stderr.trim() || result.stdout.trim()).slice(-600);
        failure = `exited ${result.code}${said ? `: ${said}` : ""}`;
      }
    } catch (error) {
      failure = error instanceof Error ? error.message : String(error);
    }
    if (failure === null) return;
    await undo().catch(() => {});
    throw new ExecutorError(
      "unavailable",
      `The start command of template '${request.template}' (the image's dormice.start label, ` +
        `'${start}') failed in sandbox ${request.id}: ${failure}. Rebuild the image ` +
        "(its deploy/images script) or look at its log inside a sandbox",
    );
  }

  /** Writes `rules` of sandbox `id` (of `team`) in the kernel and the egress proxy. */
  async applyEgress(id: string, rules: EgressRules, team?: string): Promise<void> {
    const at = await this.#network.egressEndpoint(id);
    if (at === null) throw noEgress(id);
    const proxied = needsEgressProxy(rules);
    if (proxied && this.#proxy === null) {
      throw new ExecutorError(
        "invalid",
        "This node serves no domain rules or header transforms (it has no egress CA, or its " +
          "host firewall is off): write IPv4 addresses and CIDRs, or create the sandbox on a " +
          "node that serves them",
      );
    }
    await this.#egress!.apply(id, at.ip, at.bridge, rules);
    if (proxied) {
      let port: number;
      let extra: Map<number, number>;
      try {
        port = this.#proxy!.start(at.gateway);
        extra = this.#proxy!.hold(id, at.gateway, transformPorts(rules.transforms), at.bridge);
      } catch (error) {
        if (error instanceof PortListenersFull) {
          throw new ExecutorError(
            "unavailable",
            `This node's egress proxy cannot take sandbox ${id}'s rules: ${error.message}; a ` +
              "port is free again once no sandbox's rules name it",
          );
        }
        throw new ExecutorError(
          "unavailable",
          `The egress proxy cannot start on the egress bridge's address ${at.gateway} ` +
            `(${(error as Error).message}): grant the node --allow-net and ` +
            "--allow-sys=networkInterfaces (deno task node does), then try again",
        );
      }
      // Known to the proxy before any connection is steered to it.
      this.#proxy!.set(at.ip, id, rules, team);
      await this.#egress!.steer(id, at.ip, at.bridge, port, rules.allowOut, extra);
      // Only now, with no REDIRECT of this sandbox to them left: the ports its rules dropped.
      await this.#egress!.unlisten(this.#proxy!.release(id));
    } else {
      await this.#egress!.steer(id, at.ip, at.bridge, null, rules.allowOut);
      await this.forgetEgress(id);
    }
  }

  /**
   * Sandbox `id` is gone from the egress proxy (destroyed, archived, or its rules need no
   * proxy): its connections there are cut, and the listeners for transform keys' ports no other
   * sandbox names close, with their host firewall rules. Call it once its REDIRECTs are gone.
   */
  async forgetEgress(id: string): Promise<void> {
    const closed = this.#proxy?.forget(id) ?? [];
    if (closed.length > 0) await this.#egress?.unlisten(closed);
  }

  /**
   * Adds the fleet egress CA to the sandbox's trust store: the system bundle curl, Python and
   * most tools read (`/etc/ssl/certs/ca-certificates.crt`) and the directory
   * `update-ca-certificates` reads, once (a restored sandbox has it already).
   */
  async #trustEgressCa(id: string): Promise<void> {
    const pem = this.#egressCa!.certPem;
    const mark = pem.split("\n")[1];
    const script = 'b=/etc/ssl/certs/ca-certificates.crt; grep -qF "$2" "$b" 2>/dev/null && ' +
      "exit 0; mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs && " +
      'printf "%s" "$1" > /usr/local/share/ca-certificates/dormice-egress.crt && ' +
      'printf "%s" "$1" >> "$b"';
    const result = await this.#commands.run(
      id,
      ["/bin/sh", "-c", script, "sh", pem, mark],
      "root",
      this.#startTimeoutMs,
    );
    if (result.code !== 0) {
      throw new ExecutorError(
        "unavailable",
        `The fleet egress CA could not be added to sandbox ${id}'s trust store: ` +
          `${(result.stderr.trim() || result.stdout.trim()).slice(-300)}`,
      );
    }
  }
}
