/**
 * `deno task keys`: the key verbs for an operator at a terminal. It calls a running gateway
 * (`DORMICE_GATEWAY_URL`, default `http://127.0.0.1:3677`) with the fleet token
 * (`DORMICE_API_TOKEN`):
 *
 * ```sh
 * deno task keys create --team acme [--label ci] [--max-sandboxes 10] [--creates-per-minute 60]
 * deno task keys list
 * deno task keys revoke key_0123456789abcdef
 * ```
 *
 * `create` prints the key once, as an `export E2B_API_KEY=…` line a client can paste; the gateway
 * keeps only its hash.
 *
 * Requires `--allow-net` to the gateway and `--allow-env=DORMICE_API_TOKEN,DORMICE_GATEWAY_URL`.
 *
 * @module
 */

/** What {@linkcode runKeysCommand} needs from its surroundings; injectable for tests. */
export interface KeysCommandIo {
  /** The gateway's origin. */
  gatewayUrl: string;
  /** The fleet token. */
  token: string | undefined;
  /** The HTTP client; the global `fetch` by default. */
  fetch?: typeof fetch;
  /** Where answers go (stdout). */
  print: (line: string) => void;
}

const usage = [
  "Usage:",
  "  deno task keys create --team <team> [--label <text>] [--max-sandboxes <n>] [--creates-per-minute <n>]",
  "  deno task keys list",
  "  deno task keys revoke <key id>",
  "Set DORMICE_API_TOKEN to the fleet token, and DORMICE_GATEWAY_URL when the gateway is not at " +
  "http://127.0.0.1:3677",
].join("\n");

/**
 * Runs one key command (`create`, `list` or `revoke`) against the gateway and returns the exit
 * code: 0 on success (and for `--help`, which prints the usage), 1 when the gateway refused
 * (its sentence is printed), 2 for bad usage.
 *
 * @example
 * ```ts ignore
 * const code = await runKeysCommand(["list"], {
 *   gatewayUrl: "http://127.0.0.1:3677",
 *   token: Deno.env.get("DORMICE_API_TOKEN"),
 *   print: console.log,
 * });
 * ```
 */
export async function runKeysCommand(args: string[], io: KeysCommandIo): Promise<number> {
  const [command, ...rest] = args;
  if (args.length === 1 && ["--help", "-h", "help"].includes(command)) {
    io.print(usage);
    return 0;
  }
  let verb: string;
  let body: Record<string, unknown>;
  try {
    if (command === "create") {
      verb = "createApiKey";
      body = parseCreate(rest);
    } else if (command === "list" && rest.length === 0) {
      verb = "listApiKeys";
      body = {};
    } else if (command === "revoke" && rest.length === 1) {
      verb = "revokeApiKey";
      body = { id: rest[0] };
    } else {
      throw new UsageError(
        command === undefined ? "No command given" : `Unknown command '${args.join(" ")}'`,
      );
    }
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    io.print(`${error.message}\n${usage}`);
    return 2;
  }
  if (!io.token) {
    io.print("DORMICE_API_TOKEN is not set: the key verbs take the fleet token");
    return 2;
  }
  const doFetch = io.fetch ?? fetch;
  let res: Response;
  try {
    res = await doFetch(`${io.gatewayUrl}/${verb}`, {
      method: "POST",
      headers: { authorization: `Bearer ${io.token}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
  } catch (error) {
    io.print(
      `The gateway at ${io.gatewayUrl} did not answer (${(error as Error).message}): is it ` +
        "running? Set DORMICE_GATEWAY_URL to its address",
    );
    return 1;
  }
  // deno-lint-ignore no-explicit-any
  const answer: any = await res.json().catch(() => ({ message: `HTTP ${res.status}` }));
  if (!res.ok) {
    // The gateway's 401 is worded for a client; whoever runs this holds the fleet token.
    const hint = res.status === 401
      ? ` (DORMICE_API_TOKEN here must be the fleet token the gateway at ${io.gatewayUrl} runs with)`
      : "";
    io.print(`The gateway refused ${verb} (${res.status}): ${answer.message}${hint}`);
    return 1;
  }
  if (verb === "createApiKey") {
    io.print(
      [
        `Key ${answer.id} for team '${answer.team}' (shown once; the gateway keeps only its hash):`,
        `  export E2B_API_KEY=${answer.key}`,
        `  limits: maxSandboxes ${answer.maxSandboxes ?? "none"}, createsPerMinute ${
          answer.createsPerMinute ?? "none"
        }`,
      ].join("\n"),
    );
  } else if (verb === "listApiKeys") {
    const keys = answer.keys as Record<string, unknown>[];
    if (keys.length === 0) io.print("No keys yet: deno task keys create --team <team>");
    for (const k of keys) {
      io.print(
        `${k.id}  team ${k.team}  label ${k.label ?? "-"}  maxSandboxes ${
          k.maxSandboxes ?? "-"
        }  createsPerMinute ${k.createsPerMinute ?? "-"}  created ${k.createdAt}  last used ${
          k.lastUsedAt ?? "never"
        }`,
      );
    }
  } else {
    io.print(`Revoked ${body.id}: its next request is refused`);
  }
  return 0;
}

class UsageError extends Error {}

function parseCreate(rest: string[]): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  const flags: Record<string, [string, "string" | "number"]> = {
    "--team": ["team", "string"],
    "--label": ["label", "string"],
    "--max-sandboxes": ["maxSandboxes", "number"],
    "--creates-per-minute": ["createsPerMinute", "number"],
  };
  for (let i = 0; i < rest.length; i += 2) {
    const flag = flags[rest[i]];
    const value = rest[i + 1];
    if (flag === undefined) throw new UsageError(`Unknown option '${rest[i]}'`);
    if (value === undefined) throw new UsageError(`Option '${rest[i]}' needs a value`);
    if (flag[1] === "number") {
      const n = Number(value);
      if (!Number.isInteger(n)) {
        throw new UsageError(`Option '${rest[i]}' takes a whole number: received '${value}'`);
      }
      body[flag[0]] = n;
    } else body[flag[0]] = value;
  }
  if (body.team === undefined) throw new UsageError("create needs --team <team>");
  return body;
}

if (import.meta.main) {
  const code = await runKeysCommand(Deno.args, {
    gatewayUrl: (Deno.env.get("DORMICE_GATEWAY_URL") || "http://127.0.0.1:3677").replace(/\/$/, ""),
    token: Deno.env.get("DORMICE_API_TOKEN"),
    print: (line) => console.log(line),
  });
  Deno.exit(code);
}
