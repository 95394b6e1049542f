/**
 * What `deno task fleet` prints once its fleet answers: where each part listens, one way to point
 * a client at it, and commands to try. A pure function of the fleet's shape, so its text is
 * tested without starting a fleet.
 *
 * @module
 */
import { domainInstructions, type FleetCertificates } from "./_fleet_tls.ts";

/** The fleet {@linkcode fleetBanner} describes. */
export interface FleetBannerOptions {
  /** The first gateway's origin (`https://` with a domain). */
  gatewayUrl: string;
  /** Its database, relative to the repository. */
  gatewayDb: string;
  /** `--shared`: the second gateway's origin and etcd's. */
  shared?: { gateway2Url: string; etcdUrl: string };
  nodes: { id: string; url: string; dir: string }[];
  /** `docker` or `fake`. */
  executor: string;
  /** The team the API key was minted for. */
  team: string;
  apiKey: string;
  fleetToken: string;
  /** `--domain`: the domain, the gateway's https port, why it is not 443, and the certificates. */
  domain?: { name: string; port: number; not443?: string; certs: FleetCertificates };
}

/**
 * The lines to print. With a domain the client settings are the domain's alone (`E2B_DOMAIN`,
 * the key, and the CA to trust): with `E2B_API_URL` set as well the SDK would build its URLs
 * from it, where a signed file URL names no sandbox and cannot be routed.
 *
 * @example
 * ```ts
 * import { fleetBanner } from "./_fleet_banner.ts";
 * const lines = fleetBanner({
 *   gatewayUrl: "http://127.0.0.1:3677",
 *   gatewayDb: ".dormice/fleet/gateway/gateway.db",
 *   nodes: [{ id: "node-a", url: "http://127.0.0.1:3676", dir: ".dormice/fleet/node-a" }],
 *   executor: "fake",
 *   team: "dev",
 *   apiKey: "e2b_0123",
 *   fleetToken: "t".repeat(48),
 * });
 * console.log(lines.some((l) => l.includes("export E2B_API_URL="))); // true
 * ```
 */
export function fleetBanner(options: FleetBannerOptions): string[] {
  const { gatewayUrl, shared, domain } = options;
  const auth = `-H "Authorization: Bearer $E2B_API_KEY"`;
  const fleetAuth = `-H "Authorization: Bearer $DORMICE_API_TOKEN"`;
  const curl = domain ? `curl -s --cacert ${domain.certs.caFile}` : "curl -s";
  const keysEnv = [
    ...(gatewayUrl === "http://127.0.0.1:3677" ? [] : [`DORMICE_GATEWAY_URL=${gatewayUrl}`]),
    ...(domain ? [`DENO_CERT=${domain.certs.caFile}`] : []),
  ].map((v) => `${v} `).join("");
  const client = domain
    ? domainInstructions({
      domain: domain.name,
      port: domain.port,
      not443: domain.not443,
      certs: domain.certs,
      apiKey: options.apiKey,
      team: options.team,
    })
    : [
      `Point a client at the gateway (an API key of team '${options.team}', minted just now):`,
      `  export E2B_API_URL=${gatewayUrl}/e2b/api`,
      `  export E2B_SANDBOX_URL=${gatewayUrl}/e2b/envd`,
      // The SDK's Volume file API goes here, not to E2B_API_URL.
      `  export E2B_VOLUME_API_URL=${gatewayUrl}/e2b/api`,
      `  export E2B_API_KEY=${options.apiKey}`,
    ];
  return [
    "",
    "A Dormice fleet is running on loopback:",
    `  gateway  ${gatewayUrl}   (database ${options.gatewayDb})`,
    ...(shared
      ? [
        `  gateway  ${shared.gateway2Url}   (shared mode: slots, nodes and keys in etcd at ${shared.etcdUrl})`,
      ]
      : []),
    ...options.nodes.map((n) =>
      `  ${n.id.padEnd(7)}  ${n.url}   (data ${n.dir}, ${options.executor} executor)`
    ),
    "",
    ...client,
    "The operator's fleet token (node check-ins, listNodes, minting keys with deno task keys):",
    `  export DORMICE_API_TOKEN=${options.fleetToken}`,
    "",
    "Try:",
    `  ${curl} ${auth} -d '{"name":"demo"}' ${gatewayUrl}/acquireSandbox`,
    `  ${curl} ${auth} -d '{"name":"demo","command":"echo hello"}' ${gatewayUrl}/execCommand`,
    `  ${curl} ${auth} -d '{"name":"demo"}' ${gatewayUrl}/destroySandbox`,
    `  ${curl} ${fleetAuth} -d '{}' ${gatewayUrl}/listNodes`,
    `  ${curl} ${fleetAuth} ${gatewayUrl}/metrics`,
    `  open ${gatewayUrl}/ui in a browser and log in with the fleet token`,
    `  ${keysEnv}npx -y deno@2.9.6 task keys create --team another-team --max-sandboxes 5`,
    "",
    "Ctrl-C stops them all (deno task fleet --verbose shows every part's log).",
    "",
  ];
}
