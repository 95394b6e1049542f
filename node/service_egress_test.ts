import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { SandboxService } from "./service.ts";

Deno.test("reconcile() writes the proxied rules of held sandboxes again, and only those", async () => {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor({ clock });
  const service = new SandboxService({ ledger, executor, clock });
  try {
    const named = {
      allowOut: [],
      denyOut: ["0.0.0.0/0"],
      allowDomains: ["api.example.com"],
    };
    const { sandbox: a } = await service.acquire({
      name: "named",
      spec: { network: true, egressRules: named },
    });
    const { sandbox: b } = await service.acquire({
      name: "addresses",
      spec: { network: true, egressRules: { allowOut: ["1.1.1.1/32"], denyOut: ["0.0.0.0/0"] } },
    });
    assert.equal(executor.egressHistoryOf(a.id).length, 1);
    // A node restarted over its running sandboxes: its proxy knows nothing until told again.
    await new SandboxService({ ledger, executor, clock }).reconcile();
    assert.equal(executor.egressHistoryOf(a.id).length, 2);
    assert.deepEqual(executor.egressRulesOf(a.id), named);
    // Address rules live in the kernel and survive the node: not written again.
    assert.equal(executor.egressHistoryOf(b.id).length, 1);
  } finally {
    await executor.close();
    ledger.close();
  }
});
