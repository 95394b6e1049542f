/**
 * The one egress CA `deno task fleet` gives all its nodes. A node left to itself makes a CA of
 * its own in its data dir, which suits a lone node; but the CA's fingerprint is part of the
 * config digest (sandboxes trust the CA they were made with), so two nodes each with their own
 * would disagree, and the gateway would warn at every start that one node's fleet-invariant
 * settings differ. The task makes the CA once under its data dir and points every node at it
 * with `DORMICE_EGRESS_CA_CERT` / `DORMICE_EGRESS_CA_KEY`, as an operator does for a fleet.
 *
 * @module
 */
import { EgressCa } from "../node/executors/docker/_egress_ca.ts";

/**
 * Makes (or reuses) the fleet's egress CA in `<dataRoot>/egress-ca/` and returns the variables
 * that point a node at it, paths relative to the repository (the nodes' working directory).
 * Without openssl it returns the reason instead: the nodes then start without the variables and
 * refuse domain rules, as a node without a CA does.
 *
 * @example
 * ```ts ignore
 * const ca = await fleetEgressCa(".dormice/fleet");
 * if ("env" in ca) nodeEnv = { ...nodeEnv, ...ca.env };
 * ```
 */
export async function fleetEgressCa(
  dataRoot: string,
): Promise<{ env: Record<string, string> } | { why: string }> {
  const dir = `${dataRoot}/egress-ca`;
  try {
    await EgressCa.load(null, dir);
  } catch (error) {
    return { why: (error as Error).message };
  }
  return {
    env: {
      DORMICE_EGRESS_CA_CERT: `${dir}/egress-ca.crt`,
      DORMICE_EGRESS_CA_KEY: `${dir}/egress-ca.key`,
    },
  };
}
