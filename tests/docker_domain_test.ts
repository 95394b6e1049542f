/**
 * The sandbox-domain exam: the official `e2b` SDK, unmodified and configured with only `E2B_DOMAIN` and
 * an API key, over TLS against a gateway on 443 with a Docker node on the Debian base image:
 * create, commands, files, signed URLs, `getHost(8000)` on `python3 -m http.server`, a WebSocket
 * echo server and an event stream inside the sandbox, E2B's 502 shapes and the traffic token.
 * Then the same steps with `E2B_API_URL` + `E2B_SANDBOX_URL`, ports named by `E2b-Sandbox-Port`.
 *
 * The SDK runs in a child process (tests/_domain_sdk.ts) started with `DENO_CERT` trusting a CA
 * this test makes with openssl (a wildcard certificate for `*.dormice.test`); each name the
 * child reaches (`api.dormice.test`, `<port>-<id>.dormice.test`) is added to /etc/hosts while the
 * test runs, and the file is written back exactly as it was in `finally`. Holding 127.0.0.1:443
 * is also the lock: a second run of this exam on the machine finds the port taken and skips
 * rather than edit /etc/hosts beside the first.
 *
 * Needs an engine and the images (`.ci/docker.sh`), openssl, a writable /etc/hosts and port 443
 * (root): with `CI=true` a missing one fails the suite; off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import { domainTlsEnv, makeCertificates } from "../shared/_tls_fixtures_test.ts";
import {
  codeInterpreterImageMissing,
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { startGateway } from "./_gateway.ts";
import { newToken, spawnDeno } from "./_processes.ts";

const DOMAIN = "dormice.test";
const HOSTS = "/etc/hosts";
const sdkChild = new URL("./_domain_sdk.ts", import.meta.url).pathname;
const interpreterChild = new URL("./_domain_code_interpreter.ts", import.meta.url).pathname;

/** Why the exam cannot run here, or `null` when it can. */
async function domainReadiness(): Promise<string | null> {
  try {
    const out = await new Deno.Command("openssl", { args: ["version"], stdout: "null" }).output();
    if (!out.success) return "openssl does not run";
  } catch {
    return "openssl is not installed";
  }
  try {
    // Opened for appending and closed at once: the file is not changed.
    (await Deno.open(HOSTS, { append: true })).close();
  } catch (error) {
    return `${HOSTS} is not writable (${(error as Error).name}): the exam maps names there`;
  }
  try {
    Deno.listen({ hostname: "127.0.0.1", port: 443 }).close();
  } catch (error) {
    return `127.0.0.1:443 cannot be bound (${(error as Error).name}): the SDK's https URLs ` +
      "carry no port, and another run of this exam may hold it";
  }
  return null;
}

const docker = await dockerGate("docker domain exam");
const why = docker.skip ? null : await domainReadiness();
const onCi = Deno.env.get("CI") === "true";
if (why !== null && !onCi) console.log(`docker domain exam skipped: ${why}`);
const interpreterMissing = docker.skip || docker.failure || why !== null
  ? null
  : await codeInterpreterImageMissing();
if (interpreterMissing !== null && !onCi) {
  console.log(`docker domain exam's code interpreter steps skipped: ${interpreterMissing}`);
}

/** /etc/hosts with names added for the test; `restore()` writes back the original text. */
class HostsEntries {
  #original: string;
  #names = new Set<string>();

  private constructor(original: string) {
    this.#original = original;
  }

  static async open(): Promise<HostsEntries> {
    return new HostsEntries(await Deno.readTextFile(HOSTS));
  }

  /** Maps `names` (only `<label>.dormice.test`, never anything else) to 127.0.0.1. */
  async add(names: string[]): Promise<void> {
    for (const name of names) {
      if (!/^[a-z0-9_-]{1,140}\.dormice\.test$/.test(name)) {
        throw new RangeError(`Refusing to map '${name}' in ${HOSTS}: not a name of the exam`);
      }
      this.#names.add(name);
    }
    const lines = [...this.#names].map((n) => `127.0.0.1 ${n}`).join("\n");
    const sep = this.#original.endsWith("\n") || this.#original === "" ? "" : "\n";
    // Written in place, not renamed over: /etc/hosts is often a bind mount.
    await Deno.writeTextFile(HOSTS, `${this.#original}${sep}${lines}\n`);
  }

  async restore(): Promise<void> {
    await Deno.writeTextFile(HOSTS, this.#original);
  }
}

Deno.test({
  name: "docker domain exam: the e2b SDK with only E2B_DOMAIN and a key, over TLS",
  ignore: docker.skip || (why !== null && !onCi),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (docker.failure) throw new Error(docker.failure);
  if (why !== null) throw new Error(`CI=true, so the docker domain exam must run, but ${why}`);

  const certs = await makeCertificates([`*.${DOMAIN}`]);
  const hosts = await HostsEntries.open();
  const client = Deno.createHttpClient({ caCerts: [certs.ca] });
  const token = newToken();
  const nodeId = `dkdom-${crypto.randomUUID().slice(0, 8)}`;
  const helper = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (r) => {
    try {
      await hosts.add(await r.json());
      return new Response(null, { status: 204 });
    } catch (error) {
      return new Response(String(error), { status: 400 });
    }
  });
  let gateway: Awaited<ReturnType<typeof startGateway>> | undefined;
  let node: DockerNodeProcess | undefined;
  const gw = (path: string, body?: unknown) =>
    fetch(`https://127.0.0.1${path}`, {
      client,
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  try {
    await hosts.add([`api.${DOMAIN}`, `8000-sbx_nope.${DOMAIN}`]);
    // The gateway's directory holds the certificate, so its narrow --allow-read covers it.
    gateway = await startGateway({
      token,
      port: 443,
      dir: certs.dir,
      waitForHealth: false,
      env: {
        ...domainTlsEnv(certs, DOMAIN),
        DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
        // getHost() on a WebSocket server: both hops take the upgrade only when asked.
        DORMICE_GATEWAY_WEBSOCKETS: "on",
      },
    });
    await until("the gateway to answer over TLS", gateway, async () => {
      const res = await gw("/healthz").catch(() => null);
      await res?.body?.cancel();
      return res?.status === 200;
    });
    // The node checks in over https too, trusting the same CA.
    node = await startDockerNode({
      token,
      nodeId,
      gatewayUrl: "https://127.0.0.1",
      env: { DENO_CERT: `${certs.dir}/ca.pem`, DORMICE_WEBSOCKETS: "on" },
    });
    await until("the docker node to be up at the gateway", gateway, async () => {
      const res = await gw("/listNodes", {});
      const body = await res.json() as { nodes?: { id: string; state: string }[] };
      return body.nodes?.some((n) => n.id === nodeId && n.state === "up") ?? false;
    });

    const runSdk = async (
      env: Record<string, string>,
      expectedSteps: number,
      script: string = sdkChild,
    ) => {
      const child = spawnDeno(script, {
        env: {
          ...env,
          E2B_API_KEY: token,
          DENO_CERT: `${certs.dir}/ca.pem`,
          DORMICE_EXAM_HOSTS: `http://127.0.0.1:${helper.addr.port}/`,
        },
        // The SDK reads its settings (and more) from the environment.
        permissions: [`--allow-net=127.0.0.1,*.${DOMAIN}`, "--allow-env"],
      });
      const timer = setTimeout(() => child.stop(), 240_000);
      const status = await child.exited;
      clearTimeout(timer);
      console.log(child.stdout().trimEnd());
      assert.ok(
        status.success,
        `the SDK child failed:\n${child.stdout()}\n${child.stderr()}\n` +
          `gateway:\n${gateway!.process.stderr().slice(-3000)}\nnode:\n${
            node!.process.stderr().slice(-3000)
          }`,
      );
      const steps = child.stdout().split("\n").filter((l) => l.startsWith("ok ")).length;
      assert.equal(steps, expectedSteps, child.stdout());
    };

    await t.step("E2B_DOMAIN and E2B_API_KEY only: ports by host name", async () => {
      await runSdk({ E2B_DOMAIN: DOMAIN, DORMICE_EXAM_MODE: "domain" }, 9);
    });
    await t.step("E2B_API_URL and E2B_SANDBOX_URL: ports by E2b-Sandbox-Port", async () => {
      await runSdk({
        E2B_API_URL: "https://127.0.0.1/e2b/api",
        E2B_SANDBOX_URL: "https://127.0.0.1/e2b/envd",
        DORMICE_EXAM_MODE: "header",
      }, 8);
    });
    // The code interpreter (its own image, so its own gate: skipped with a reason off CI when
    // the image is not built) on port 49999 in both modes.
    for (
      const [mode, env] of [
        ["domain", { E2B_DOMAIN: DOMAIN }],
        ["header", {
          E2B_API_URL: "https://127.0.0.1/e2b/api",
          E2B_SANDBOX_URL: "https://127.0.0.1/e2b/envd",
        }],
      ] as const
    ) {
      await t.step({
        name:
          `@e2b/code-interpreter in ${mode} mode: runCode on port 49999, traffic token required`,
        ignore: interpreterMissing !== null && !onCi,
        fn: async () => {
          if (interpreterMissing) {
            throw new Error(`CI=true, so this step must run, but ${interpreterMissing}`);
          }
          await runSdk({ ...env, DORMICE_EXAM_MODE: mode }, 3, interpreterChild);
        },
      });
    }
  } finally {
    await node?.stop();
    await gateway?.stop();
    await removeContainersOf([nodeId]);
    await helper.shutdown();
    client.close();
    await hosts.restore();
    await Deno.remove(certs.dir, { recursive: true }).catch(() => {});
  }
});

/** Polls `check` every 200 ms for up to 30 s; the gateway's stderr explains a failure. */
async function until(
  what: string,
  gateway: { process: { stderr(): string } },
  check: () => Promise<boolean>,
): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`Gave up waiting 30 s for ${what}:\n${gateway.process.stderr()}`);
}
