import assert from "node:assert/strict";
import { ExecutorError } from "../contract.ts";
import { HostFirewall, type IptablesRunner } from "./_firewall.ts";
import { FakeIptables } from "./_fake_iptables_test.ts";

const bridge = "dm-0123456789-i";
const network = "dormice-n1-internal";

Deno.test("HostFirewall.guard() installs the rule first in INPUT once; a second guard adds none", async () => {
  const iptables = new FakeIptables();
  iptables.chains.get("INPUT")!.push("-j ACCEPT");
  const firewall = new HostFirewall({ run: iptables.run });
  assert.equal(await firewall.guard(bridge, network), true);
  // A node restarted over its own network: the rule is found, not added again.
  assert.equal(await new HostFirewall({ run: iptables.run }).guard(bridge, network), false);
  assert.deepEqual(iptables.chains.get("INPUT"), [
    `-i ${bridge} -m conntrack ! --ctstate ESTABLISHED,RELATED -m comment --comment ` +
    `"dormice ${network}: sandboxes may not connect to this host" -j DROP`,
    "-j ACCEPT",
  ]);
});

Deno.test("HostFirewall.unguard() removes every copy of the rule and no other", async () => {
  const iptables = new FakeIptables();
  const firewall = new HostFirewall({ run: iptables.run });
  await firewall.guard(bridge, network);
  await firewall.guard("dm-other-bridge", "dormice-n2-internal");
  // Two processes that raced to install it leave two copies.
  iptables.chains.get("INPUT")!.push(iptables.chains.get("INPUT")!.at(-1)!);
  assert.equal(await firewall.unguard(bridge, network), 2);
  assert.equal(iptables.count("INPUT", bridge), 0);
  assert.equal(iptables.count("INPUT", "dm-other-bridge"), 1);
  assert.equal(await firewall.unguard(bridge, network), 0, "nothing left is no error");
});

Deno.test("HostFirewall.check() passes whether or not the rule exists, and refuses what cannot manage it", async () => {
  const iptables = new FakeIptables();
  const firewall = new HostFirewall({ run: iptables.run });
  await firewall.check(bridge, network);
  await firewall.guard(bridge, network);
  await firewall.check(bridge, network);

  iptables.refuse =
    "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)";
  const refused = (run: IptablesRunner) =>
    new HostFirewall({ run }).check(bridge, network).then(
      () => assert.fail("check() passed"),
      (error: unknown) => {
        assert.ok(error instanceof ExecutorError);
        assert.equal(error.code, "unavailable");
        return error.message;
      },
    );
  const notRoot = await refused(iptables.run);
  assert.match(notRoot, /^The node cannot manage the firewall rule that keeps sandboxes from/);
  assert.match(notRoot, /you must be root/);
  assert.match(notRoot, /run the node as root with iptables installed and --allow-run=iptables/);
  assert.match(notRoot, /or set DORMICE_SANDBOX_HOST_FIREWALL=off to run without it/);

  const missing = await refused(() => Promise.reject(new Deno.errors.NotFound("No such file")));
  assert.match(missing, /iptables is not installed \(Debian: apt-get install iptables\)/);
  const denied = await refused(() =>
    Promise.reject(new Deno.errors.NotCapable('Requires run access to "iptables"'))
  );
  assert.match(denied, /this process may not run it: Requires run access/);
});

Deno.test("HostFirewall bounds a run that does not answer", async () => {
  const hung: IptablesRunner = (_args, signal) =>
    new Promise((resolve) =>
      // As Deno.Command does: a killed run resolves with a signal's exit code.
      signal.addEventListener("abort", () => resolve({ code: 143, stdout: "", stderr: "" }))
    );
  const error = await new HostFirewall({ run: hung, timeoutMs: 20 }).check(bridge, network)
    .catch((e) => e);
  assert.ok(error instanceof ExecutorError, String(error));
  assert.match(error.message, /no answer within 20 ms/);
});

Deno.test("HostFirewall.verifyNoInterContainer() finds the engine's DROP rule in any chain", async () => {
  const iptables = new FakeIptables();
  const firewall = new HostFirewall({ run: iptables.run });
  const refusal = await firewall.verifyNoInterContainer(bridge, network).catch((e) => e);
  assert.ok(refusal instanceof ExecutorError);
  assert.match(
    refusal.message,
    /^The Docker engine installed no rule keeping the sandboxes on network dormice-n1-internal .*run dockerd with its iptables rules on/,
  );
  // Docker 20–27: FORWARD; later versions: a chain of their own.
  iptables.chains.set("DOCKER-FORWARD", [`-i ${bridge} -o ${bridge} -j DROP`]);
  await firewall.verifyNoInterContainer(bridge, network);
  // Another bridge's rule, or an ACCEPT (icc on), is not this bridge's DROP.
  iptables.chains.set("DOCKER-FORWARD", [
    `-i ${bridge}x -o ${bridge}x -j DROP`,
    `-i ${bridge} -o ${bridge} -j ACCEPT`,
  ]);
  assert.ok(await firewall.verifyNoInterContainer(bridge, network).catch((e) => e));
});
