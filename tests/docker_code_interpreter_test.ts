/**
 * The code interpreter's exam on Docker: the official `@e2b/code-interpreter` package,
 * unmodified, pointed at a real gateway (`E2B_API_URL` = `/e2b/api`, `E2B_SANDBOX_URL` =
 * `/e2b/envd`, so each call reaches port 49999 through the `E2b-Sandbox-Port` header) in front of
 * a real node process on the Docker executor. `Sandbox.create()` takes the package's default
 * template, `code-interpreter-v1`, which the node serves from `dormice-code-interpreter:latest`
 * (`deploy/images/build-code-interpreter.sh`); the server inside is started by the node before the
 * sandbox is handed out.
 *
 * Needs an engine and the image (`.ci/docker.sh` builds both): with `CI=true` it never skips;
 * off CI it skips with a printed reason. Needs --allow-net=127.0.0.1,unix:/var/run/docker.sock
 * --allow-env --allow-run --allow-read --allow-write.
 */
import assert from "node:assert/strict";
import { NotFoundError, Sandbox, SandboxError } from "@e2b/code-interpreter";
import { startGateway } from "./_gateway.ts";
import {
  codeInterpreterImageMissing,
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const SUITE = "docker code interpreter suite";
const gate = await dockerGate(SUITE);

const missing = gate.skip || gate.failure ? null : await codeInterpreterImageMissing();
const onCi = Deno.env.get("CI") === "true";
const skip = gate.skip || (missing !== null && !onCi);
const failure = gate.failure ??
  (missing !== null && onCi ? `CI=true, so the ${SUITE} must run, but ${missing}` : null);
if (missing !== null && !onCi) console.log(`${SUITE} skipped: ${missing}`);

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

Deno.test({
  name: "@e2b/code-interpreter runs cells on the fleet's Docker node: state, streams, errors, " +
    "charts, contexts",
  ignore: skip,
  sanitizeOps: false,
  sanitizeResources: false,
  async fn(t) {
    if (failure) throw new Error(failure);
    const nodeId = `dkci-${crypto.randomUUID().slice(0, 8)}`;
    const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    let node: DockerNodeProcess | undefined;
    try {
      node = await startDockerNode({ token: gw.token, gatewayUrl: gw.url, nodeId });
      await until("the docker node to be up at the gateway", async () => {
        const { body } = await gw.json("listNodes");
        return body.nodes.some((n: { id: string; state: string }) =>
          n.id === nodeId && n.state === "up"
        );
      });
      const opts = {
        apiUrl: `${gw.url}/e2b/api`,
        sandboxUrl: `${gw.url}/e2b/envd`,
        apiKey: gw.token,
      };
      let sandbox!: Sandbox;

      const created = await t.step(
        "Sandbox.create() with no template argument gives a code-interpreter sandbox",
        async () => {
          sandbox = await Sandbox.create(opts);
          const info = await sandbox.getInfo();
          assert.equal(info.templateId, "code-interpreter-v1");
        },
      );
      if (!created) return;

      await t.step("state is kept between cells: x = 40, then x + 2 is 42", async () => {
        const first = await sandbox.runCode("x = 40");
        assert.equal(first.error, undefined);
        const second = await sandbox.runCode("x + 2");
        assert.equal(second.error, undefined);
        assert.equal(second.text, "42");
        assert.ok(second.executionCount! >= 2, `executionCount ${second.executionCount}`);
      });

      await t.step("onStdout receives a line while the cell still runs", async () => {
        // The cell prints, then waits for a file that the test writes only once onStdout had
        // the first line: without streaming, the cell would end on its own bound, saying so.
        const go = `/tmp/go-${crypto.randomUUID().slice(0, 8)}`;
        const seen: string[] = [];
        let wrote: Promise<unknown> | undefined;
        const run = await sandbox.runCode(
          [
            "import os, time",
            'print("first", flush=True)',
            "for _ in range(300):",
            `    if os.path.exists(${JSON.stringify(go)}): break`,
            "    time.sleep(0.1)",
            "else:",
            '    print("the go file never came")',
            'print("second")',
          ].join("\n"),
          {
            onStdout: (output) => {
              seen.push(output.line);
              if (output.line.includes("first")) wrote ??= sandbox.files.write(go, "go");
            },
          },
        );
        await wrote;
        assert.equal(run.error, undefined);
        assert.deepEqual(seen.join(""), "first\nsecond\n");
        assert.deepEqual(run.logs.stdout.join(""), "first\nsecond\n");
        const stderr: string[] = [];
        await sandbox.runCode("import sys; sys.stderr.write('oops\\n')", {
          onStderr: (output) => void stderr.push(output.line),
        });
        assert.equal(stderr.join(""), "oops\n");
      });

      await t.step("1/0 is an error named ZeroDivisionError, with its traceback", async () => {
        const run = await sandbox.runCode("1/0");
        assert.equal(run.error?.name, "ZeroDivisionError");
        assert.equal(run.error?.value, "division by zero");
        assert.match(run.error?.traceback ?? "", /ZeroDivisionError/);
      });

      await t.step("a matplotlib plot comes back as a PNG result", async () => {
        const run = await sandbox.runCode(
          "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()",
        );
        assert.equal(run.error, undefined);
        const png = run.results.find((r) => r.png)?.png;
        assert.ok(png, `no PNG among ${JSON.stringify(run.results.map((r) => r.formats()))}`);
        const bytes = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
        assert.deepEqual([...bytes.subarray(0, 8)], PNG_SIGNATURE);
        assert.ok(bytes.length > 1000, `a ${bytes.length}-byte PNG`);
      });

      await t.step("env_vars reach one cell only", async () => {
        const run = await sandbox.runCode("import os; os.environ.get('GREETING')", {
          envs: { GREETING: "hi" },
        });
        assert.equal(run.text, "'hi'");
        const after = await sandbox.runCode("import os; repr(os.environ.get('GREETING'))");
        assert.equal(after.text, `'None'`);
      });

      await t.step(
        "a new context does not see another's variables; list, restart, remove",
        async () => {
          const context = await sandbox.createCodeContext({ cwd: "/tmp" });
          assert.equal(context.language, "python");
          assert.equal(context.cwd, "/tmp");
          const isolated = await sandbox.runCode("x", { context });
          assert.equal(isolated.error?.name, "NameError");
          const cwd = await sandbox.runCode("import os; os.getcwd()", { context });
          assert.equal(cwd.text, "'/tmp'");
          await sandbox.runCode("y = 1", { context });
          const listed = await sandbox.listCodeContexts();
          assert.ok(listed.some((c) => c.id === context.id), JSON.stringify(listed));
          await sandbox.restartCodeContext(context);
          const restarted = await sandbox.runCode("y", { context });
          assert.equal(restarted.error?.name, "NameError");
          // The default context still has its x.
          assert.equal((await sandbox.runCode("x")).text, "40");
          await sandbox.removeCodeContext(context);
          const gone = await sandbox.runCode("1", { context }).catch((error) => error);
          assert.ok(gone instanceof NotFoundError, String(gone));
          assert.match(gone.message, /does not exist/);
        },
      );

      await t.step(
        "a language without a kernel is refused with a sentence naming python",
        async () => {
          const error = await sandbox.runCode("1", { language: "javascript" }).catch((e) => e);
          assert.ok(error instanceof SandboxError, String(error));
          assert.match(error.message, /^400/);
        },
      );

      await t.step(
        "a cell that kills its kernel is an error; the context gets a fresh kernel",
        async () => {
          const context = await sandbox.createCodeContext();
          await sandbox.runCode("z = 1", { context });
          const died = await sandbox.runCode("import os; os._exit(1)", { context });
          assert.equal(died.error?.name, "KernelDied");
          const after = await sandbox.runCode("z", { context });
          assert.equal(after.error?.name, "NameError", "a fresh kernel: z is gone");
          assert.equal((await sandbox.runCode("1 + 1", { context })).text, "2");
          await sandbox.removeCodeContext(context);
        },
      );

      await t.step("kill ends the sandbox", async () => {
        assert.equal(await sandbox.kill(), true);
      });

      await t.step(
        "from a warm pool, Sandbox.create() is a claim whose server answers",
        async () => {
          const pools = async () => {
            const res = await fetch(`${node!.url}/listPools`, {
              method: "POST",
              headers: {
                authorization: `Bearer ${node!.token}`,
                "content-type": "application/json",
              },
              body: "{}",
            });
            return (await res.json()).pools as { warm: number; claimed: number }[];
          };
          const set = await gw.json("setPools", {
            pools: [{ template: "code-interpreter-v1", warm: 1 }],
          });
          assert.equal(set.status, 200, JSON.stringify(set.body));
          await until("the code interpreter pool to be warm", async () => {
            const { body } = await gw.json("listNodes");
            // deno-lint-ignore no-explicit-any
            return body.nodes.find((n: any) => n.id === nodeId)?.pools?.[0]?.warm === 1;
          }, 60_000);
          const claimed = await Sandbox.create(opts);
          try {
            assert.equal((await pools())[0].claimed, 1, "the create was a claim");
            const run = await claimed.runCode("6 * 7");
            assert.equal(run.text, "42");
          } finally {
            await claimed.kill();
            await gw.json("setPools", { pools: [] });
          }
        },
      );
    } finally {
      await node?.stop();
      await gw.stop();
      await removeContainersOf([nodeId]);
    }
  },
});
