import assert from "node:assert/strict";
import { FakeExecutor } from "./fake.ts";
import { NodeMetrics } from "../metrics.ts";
import { instrumentExecutor } from "./instrumented.ts";

Deno.test("instrumentExecutor() passes limits() through: the E2B info reads it", async () => {
  const fake = new FakeExecutor({ defaults: { cpus: 2 } });
  const executor = instrumentExecutor(fake, new NodeMetrics());
  assert.deepEqual(executor.limits({ memoryMB: 256 }), { cpus: 2, memoryMB: 256 });
  await executor.close();
});
