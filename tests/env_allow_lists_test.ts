/**
 * The daemons' `--allow-env` lists against what their code reads. Each daemon copies exactly the
 * variables of its list out of `Deno.env` and hands them to a pure loader, so a variable the loader
 * reads but the list lacks is silently unset, and a list that names a variable nobody reads asks
 * for a permission it does not need. The `deno task` lines must name the same lists.
 *
 * The Docker executor's dependencies read and list the environment as they load; under the node
 * task's `--ignore-env` they see only the listed variables, and the load is proven in a child
 * process with exactly the task's env flags.
 */
import assert from "node:assert/strict";
import { loadGatewayConfig } from "../gateway/config.ts";
import { gatewayEnvVariables } from "../gateway/mod.ts";
import { loadNodeConfig } from "../node/config.ts";
import { nodeEnvVariables } from "../node/mod.ts";
import { readEgressSettings } from "../node/config_egress.ts";
import denoJson from "../deno.json" with { type: "json" };
import { repoRoot } from "./_processes.ts";

/** The names `load` reads from its env, over envs that take each loader down its branches. */
function namesRead(
  load: (env: Record<string, string | undefined>) => unknown,
  envs: Record<string, string>[],
): Set<string> {
  const read = new Set<string>();
  for (const values of envs) {
    const env = new Proxy(values, {
      get(target, name) {
        if (typeof name === "string") read.add(name);
        return Reflect.get(target, name);
      },
    });
    load(env);
  }
  return read;
}

/** The `--allow-env=` names of a `deno task` line, in order. */
function taskAllowEnv(task: string): string[] {
  const match = / --allow-env=([^ ]+)/.exec(task);
  assert.ok(match, `the task names its variables with --allow-env=<list>: ${task}`);
  return match[1].split(",");
}

const every = (names: readonly string[], value: string) =>
  Object.fromEntries(names.map((n) => [n, value]));

Deno.test("gatewayEnvVariables: the gateway's config reads exactly these, and deno task gateway allows them", () => {
  const read = namesRead(loadGatewayConfig, [
    {},
    every(gatewayEnvVariables, "1"),
    {
      DORMICE_API_TOKEN: "t".repeat(32),
      DORMICE_WEBHOOK_URL: "http://127.0.0.1:9/hook",
      DORMICE_WEBHOOK_SECRET: "s".repeat(32),
      DORMICE_GATEWAY_ETCD: "http://127.0.0.1:2379",
      DORMICE_GATEWAY_TLS_CERT: "/etc/dormice/cert.pem",
      DORMICE_GATEWAY_TLS_KEY: "/etc/dormice/key.pem",
      DORMICE_SANDBOX_DOMAIN: "sbx.example.com",
    },
  ]);
  assert.deepEqual([...read].sort(), [...gatewayEnvVariables].sort());
  assert.deepEqual(taskAllowEnv(denoJson.tasks.gateway).sort(), [...gatewayEnvVariables].sort());
});

Deno.test("nodeEnvVariables: the node's config reads exactly these, and deno task node allows them", () => {
  // The daemon reads its settings through both loaders.
  const read = namesRead((env) => {
    loadNodeConfig(env);
    readEgressSettings((name) => env[name]);
  }, [
    {},
    every(nodeEnvVariables, "1"),
    {
      DORMICE_API_TOKEN: "t".repeat(32),
      DORMICE_EXECUTOR: "docker",
      DOCKER_HOST: "unix:///run/docker.sock",
      DORMICE_GATEWAY_ENDPOINT: "http://127.0.0.1:3677",
      DORMICE_GATEWAY_CHECK_IN_HEADER: "x-host-auth: secret",
      DORMICE_POOLS: "base=1",
      DORMICE_VOLUMES: "data",
      DORMICE_SANDBOX_DOMAIN: "sbx.example.com",
    },
  ]);
  assert.deepEqual([...read].sort(), [...nodeEnvVariables].sort());
  assert.deepEqual(taskAllowEnv(denoJson.tasks.node).sort(), [...nodeEnvVariables].sort());
});

Deno.test("deno task node's env flags load the Docker executor, whose dependencies list the environment", async () => {
  const task = denoJson.tasks.node;
  assert.match(task, / --ignore-env /, "unlisted variables read as unset rather than refused");
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--frozen",
      `--allow-env=${taskAllowEnv(task).join(",")}`,
      "--ignore-env",
      "--allow-read",
      // The module as the main one: it only loads (dockerode and its dependencies) and exits.
      "node/executors/docker/mod.ts",
    ],
    cwd: repoRoot,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  });
  const out = await child.output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, text);
  assert.equal(text, "");
});

Deno.test("deploy/: the systemd units grant the daemons exactly their lists", async () => {
  for (
    const [unit, list, ignore] of [
      ["dormice-node.service", nodeEnvVariables, true],
      ["dormice-gateway.service", gatewayEnvVariables, false],
    ] as const
  ) {
    const text = await Deno.readTextFile(`${repoRoot}/deploy/${unit}`);
    const execStart = text.replace(/\\\n\s*/g, " ").split("\n").find((l) =>
      l.startsWith("ExecStart=")
    );
    assert.ok(execStart, `${unit} has an ExecStart line`);
    assert.deepEqual(taskAllowEnv(execStart).sort(), [...list].sort(), unit);
    assert.equal(/ --ignore-env /.test(execStart), ignore, `${unit}: --ignore-env`);
  }
});
