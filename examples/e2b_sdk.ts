/**
 * The official `e2b` SDK, unmodified, against a Dormice fleet: create a sandbox, run a command,
 * write and read a file, kill it. The SDK reads the three variables itself.
 *
 * Run it:
 * ```sh
 * deno task fleet                      # terminal 1: a gateway and two nodes; prints the lines below
 * export E2B_API_URL=http://127.0.0.1:3677/e2b/api
 * export E2B_SANDBOX_URL=http://127.0.0.1:3677/e2b/envd
 * export E2B_API_KEY=<the API key deno task fleet minted and printed (never the fleet token)>
 * deno run --allow-net=127.0.0.1 --allow-env examples/e2b_sdk.ts
 * ```
 *
 * @module
 */
import { Sandbox } from "e2b";

for (const name of ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"]) {
  if (!Deno.env.get(name)) {
    console.error(
      `${name} is not set: start a fleet with 'deno task fleet' and export the three E2B_* ` +
        "lines it prints",
    );
    Deno.exit(2);
  }
}

const sandbox = await Sandbox.create({ metadata: { name: "e2b-sdk-example" } });
try {
  const info = await sandbox.getInfo();
  console.log(
    `sandbox ${sandbox.sandboxId}: ${info.state}, metadata ${JSON.stringify(info.metadata)}`,
  );
  const run = await sandbox.commands.run("echo hello");
  console.log(`command: exit ${run.exitCode}, stdout ${JSON.stringify(run.stdout)}`);
  await sandbox.files.write("/tmp/greeting.txt", "hi from the e2b SDK\n");
  console.log(`file: ${JSON.stringify(await sandbox.files.read("/tmp/greeting.txt"))}`);
} finally {
  console.log(`killed: ${await sandbox.kill()}`);
}
