/**
 * What a fake executor is made with: its options, and the templates it accepts when given none.
 *
 * @module
 */
import type { Clock } from "../../shared/clock.ts";
import type { SandboxLimits } from "./contract.ts";
import { DEFAULT_TEMPLATES, parseTemplates } from "./docker/templates.ts";

/** Options of {@linkcode FakeExecutor}. */
export interface FakeExecutorOptions {
  /**
   * Templates it accepts: the names of `DORMICE_TEMPLATES` on a node, the names of
   * {@linkcode DEFAULT_TEMPLATES} when absent, as the Docker executor does.
   */
  templates?: Iterable<string>;
  /** Volume names a create may mount (nothing is mounted: the names are only checked). */
  volumes?: string[];
  /**
   * The node's managed volumes: a name it answers with a directory may be mounted too (only
   * checked, like `volumes`).
   */
  managedVolumes?: (name: string) => string | undefined;
  /** Stamps file modification times and `stats().takenAt`; `systemClock` when absent. */
  clock?: Clock;
  /** Limits of a spec that sets none: Docker's defaults (1 cpu, 512 MiB) when absent. */
  defaults?: Partial<SandboxLimits>;
  /**
   * Whether it takes egress address rules (recorded, see `egressRulesOf`); true by default.
   * False stands for a node that cannot enforce them: a create asking for them is refused,
   * `setEgressRules` is absent and the capabilities say so.
   */
  egressRules?: boolean;
  /** The node id its snapshots record as their origin; `"fake"` when absent. */
  nodeId?: string;
}

/** The template names of {@linkcode DEFAULT_TEMPLATES}, which always parses. */
export function defaultTemplateNames(): string[] {
  const parsed = parseTemplates(DEFAULT_TEMPLATES);
  return typeof parsed === "string" ? ["base"] : [...parsed.keys()];
}
