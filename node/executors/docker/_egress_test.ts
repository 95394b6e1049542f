import assert from "node:assert/strict";
import { ExecutorError } from "../contract.ts";
import { egressAllows, type EgressRules } from "../../../shared/egress_rules.ts";
import { DOCKER_USER, EgressFirewall } from "./_egress.ts";
import { FakeIptables } from "./_fake_iptables_test.ts";

const bridge = "dm-0123456789-e";
const A = "198.18.0.1";
const B = "198.18.0.2";
const C = "203.0.113.9";
const destinations = [A, B, C];

function setup() {
  const iptables = new FakeIptables();
  iptables.chains.set(DOCKER_USER, ["-j RETURN"]);
  const firewall = new EgressFirewall({ instanceId: "inst1", run: iptables.run });
  return { iptables, firewall };
}

/** Whether `cidr` holds `address`, for the fake's packet walk. */
function within(cidr: string, address: string): boolean {
  return egressAllows({ allowOut: [cidr], denyOut: ["0.0.0.0/0"] }, address);
}

/**
 * What the filter table does with a packet from `src` on `bridge` to `dst`: walks DOCKER-USER as
 * the kernel would (matches on -i, -s, -d; RETURN, REJECT and jumps).
 */
function verdict(iptables: FakeIptables, src: string, dst: string): "pass" | "reject" {
  const walk = (chain: string, depth: number): "return" | "reject" => {
    assert.ok(depth < 8, "no loops");
    for (const rule of iptables.chains.get(chain) ?? []) {
      const w = rule.split(" ");
      const arg = (flag: string) => (w.includes(flag) ? w[w.indexOf(flag) + 1] : undefined);
      if (arg("-i") !== undefined && arg("-i") !== bridge) continue;
      if (arg("-s") !== undefined && !within(arg("-s")!, src)) continue;
      if (arg("-d") !== undefined && !within(arg("-d")!, dst)) continue;
      const target = arg("-j")!;
      if (target === "RETURN") return "return";
      if (target === "REJECT") return "reject";
      if (walk(target, depth + 1) === "reject") return "reject";
    }
    return "return";
  };
  return walk(DOCKER_USER, 0) === "reject" ? "reject" : "pass";
}

const vector = (iptables: FakeIptables, src: string) =>
  destinations.map((d) => verdict(iptables, src, d)).join(",");
const expected = (rules: EgressRules | null) =>
  destinations.map((d) => (rules === null || egressAllows(rules, d) ? "pass" : "reject")).join(
    ",",
  );

Deno.test("EgressFirewall.apply() enforces allow over deny for its sandbox's address only", async () => {
  const { iptables, firewall } = setup();
  const rules = { allowOut: [`${A}/32`], denyOut: ["0.0.0.0/0"] };
  await firewall.apply("sb1", "172.30.0.2", bridge, rules);
  assert.equal(vector(iptables, "172.30.0.2"), "pass,reject,reject");
  assert.equal(vector(iptables, "172.30.0.2"), expected(rules));
  // Another sandbox on the same bridge keeps its own (none): nothing leaks to it.
  assert.equal(vector(iptables, "172.30.0.3"), "pass,pass,pass");
  await firewall.apply("sb2", "172.30.0.3", bridge, { allowOut: [], denyOut: [`${B}/32`] });
  assert.equal(vector(iptables, "172.30.0.3"), "pass,reject,pass");
  assert.equal(vector(iptables, "172.30.0.2"), "pass,reject,reject");
  // The jump sits first, ahead of the engine's RETURN; names are scoped by instance and id.
  assert.match(iptables.chains.get(DOCKER_USER)![0], /--comment "dormice:inst1:sb2" -j DMN-/);
  assert.notEqual(firewall.chains("sb1").dispatch, firewall.chains("sb2").dispatch);
  const other = new EgressFirewall({ instanceId: "inst2", run: iptables.run });
  assert.notEqual(other.chains("sb1").dispatch, firewall.chains("sb1").dispatch);
});

Deno.test("EgressFirewall.apply() swaps rule sets atomically: each step enforces the old set or the new, never none or both", async () => {
  const { iptables, firewall } = setup();
  const ip = "172.30.0.2";
  const sets: EgressRules[] = [
    { allowOut: [`${A}/32`], denyOut: ["0.0.0.0/0"] },
    { allowOut: [`${B}/32`], denyOut: ["0.0.0.0/0"] },
    { allowOut: [], denyOut: [`${C}/32`] },
    { allowOut: [`${A}/32`, `${C}/32`], denyOut: ["0.0.0.0/0"] },
  ];
  await firewall.apply("sb1", ip, bridge, sets[0]);
  for (let i = 1; i < sets.length; i++) {
    const allowed = [expected(sets[i - 1]), expected(sets[i])];
    let steps = 0;
    iptables.after = () => {
      steps++;
      const now = vector(iptables, ip);
      assert.ok(allowed.includes(now), `step ${steps} of set ${i}: ${now} is neither ${allowed}`);
    };
    await firewall.apply("sb1", ip, bridge, sets[i]);
    iptables.after = null;
    assert.ok(steps > 2, "the swap took several writes, each checked");
    assert.equal(vector(iptables, ip), expected(sets[i]));
  }
  // One dispatch chain and one rules chain are left, not one per update.
  const { dispatch } = firewall.chains("sb1");
  assert.deepEqual([...iptables.chains.keys()].filter((c) => c.startsWith(dispatch)).length, 2);
});

Deno.test("EgressFirewall.apply() that fails midway leaves the rules in force before, and a retry completes", async () => {
  const { iptables, firewall } = setup();
  const ip = "172.30.0.2";
  const before = { allowOut: [`${A}/32`], denyOut: ["0.0.0.0/0"] };
  const after = { allowOut: [`${B}/32`], denyOut: ["0.0.0.0/0"] };
  await firewall.apply("sb1", ip, bridge, before);
  iptables.failOn = "-R";
  const error = await firewall.apply("sb1", ip, bridge, after).catch((e) => e);
  assert.ok(error instanceof ExecutorError && error.code === "unavailable", String(error));
  assert.match(error.message, /could not write a sandbox's egress rules .* still are/);
  assert.equal(vector(iptables, ip), expected(before));
  await firewall.apply("sb1", ip, bridge, after);
  assert.equal(vector(iptables, ip), expected(after));
});

Deno.test("EgressFirewall.apply() puts back a jump a firewall reload removed", async () => {
  const { iptables, firewall } = setup();
  const rules = { allowOut: [], denyOut: ["0.0.0.0/0"] };
  await firewall.apply("sb1", "172.30.0.2", bridge, rules);
  iptables.chains.set(DOCKER_USER, ["-j RETURN"]);
  assert.equal(vector(iptables, "172.30.0.2"), "pass,pass,pass");
  await firewall.apply("sb1", "172.30.0.2", bridge, rules);
  assert.equal(vector(iptables, "172.30.0.2"), "reject,reject,reject");
  assert.equal(iptables.count(DOCKER_USER, "dormice:inst1:sb1"), 1);
});

Deno.test("EgressFirewall.remove() takes the sandbox's jump and chains and nothing else", async () => {
  const { iptables, firewall } = setup();
  await firewall.apply("sb1", "172.30.0.2", bridge, { allowOut: [], denyOut: ["0.0.0.0/0"] });
  await firewall.apply("sb2", "172.30.0.3", bridge, { allowOut: [], denyOut: ["0.0.0.0/0"] });
  assert.equal(await firewall.remove("sb1"), true);
  assert.equal(vector(iptables, "172.30.0.2"), "pass,pass,pass");
  assert.equal(vector(iptables, "172.30.0.3"), "reject,reject,reject");
  assert.equal(iptables.count(DOCKER_USER, "dormice:inst1:sb1"), 0);
  const { dispatch } = firewall.chains("sb1");
  assert.deepEqual([...iptables.chains.keys()].filter((c) => c.startsWith(dispatch)), []);
  assert.equal(await firewall.remove("sb1"), false, "nothing left is no error");
});

Deno.test("EgressFirewall refuses with a sentence naming root, iptables and the engine's rules", async () => {
  const { iptables, firewall } = setup();
  iptables.refuse = "iptables v1.8.9 (nf_tables): Permission denied (you must be root)";
  const error = await firewall.apply("sb1", "172.30.0.2", bridge, { allowOut: [], denyOut: [] })
    .catch((e) => e);
  assert.ok(error instanceof ExecutorError && error.code === "unavailable", String(error));
  assert.match(error.message, /you must be root.*needs root, iptables and --allow-run=iptables/);
});

Deno.test("EgressFirewall.removeBridge() removes this instance's leftovers on one bridge only", async () => {
  const { iptables, firewall } = setup();
  const deny = { allowOut: [], denyOut: ["0.0.0.0/0"] };
  await firewall.apply("sb1", "172.30.0.2", bridge, deny);
  await firewall.apply("sb2", "172.30.0.3", bridge, deny);
  await firewall.apply("sb3", "172.31.0.2", "dm-other-e", deny);
  const other = new EgressFirewall({ instanceId: "inst2", run: iptables.run });
  await other.apply("sb9", "172.30.0.9", bridge, deny);
  assert.equal(await firewall.removeBridge(bridge), 2);
  assert.equal(iptables.count(DOCKER_USER, "inst1:sb1"), 0);
  assert.equal(iptables.count(DOCKER_USER, "inst1:sb2"), 0);
  assert.equal(iptables.count(DOCKER_USER, "inst1:sb3"), 1, "another bridge keeps its rules");
  assert.equal(iptables.count(DOCKER_USER, "inst2:sb9"), 1, "another instance keeps its rules");
  for (const id of ["sb1", "sb2"]) {
    const { dispatch } = firewall.chains(id);
    assert.deepEqual([...iptables.chains.keys()].filter((c) => c.startsWith(dispatch)), []);
  }
  assert.equal(await firewall.removeBridge(bridge), 0);
});

Deno.test("EgressFirewall.steer() redirects the sandbox's ports 80 and 443 but its allowed addresses, and undoes it", async () => {
  const { iptables, firewall } = setup();
  const ip = "172.30.0.2";
  await firewall.apply("sb1", ip, bridge, { allowOut: [`${A}/32`], denyOut: ["0.0.0.0/0"] });
  await firewall.steer("sb1", ip, bridge, 41000, [`${A}/32`]);
  const { dispatch } = firewall.chains("sb1");
  const nat = iptables.chains.get(`nat:${dispatch}-n`);
  assert.deepEqual(nat, [
    `-d ${A}/32 -j RETURN`,
    "-p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 41000",
  ]);
  const jumps = iptables.chains.get("nat:PREROUTING")!;
  assert.equal(jumps.length, 1);
  assert.match(jumps[0], new RegExp(`^-i ${bridge} -s ${ip}/32 .*dormice:inst1:sb1.* -j nat:`));
  // Only redirected connections are let through the host firewall, and first.
  assert.match(
    iptables.chains.get("INPUT")![0],
    /--dport 41000 -m conntrack --ctstate DNAT .* -j ACCEPT$/,
  );
  // Again (an updateNetwork): the same one jump, the chain refilled.
  await firewall.steer("sb1", ip, bridge, 41000, []);
  assert.equal(iptables.chains.get("nat:PREROUTING")!.length, 1);
  assert.equal(iptables.chains.get(`nat:${dispatch}-n`)!.length, 1);
  assert.equal(iptables.count("INPUT", "dormice:egress-proxy"), 1);
  // A restarted node's proxy listens on another port: its rule replaces the old one.
  await firewall.steer("sb1", ip, bridge, 42000, []);
  assert.equal(iptables.count("INPUT", "dormice:egress-proxy"), 1);
  assert.equal(iptables.count("INPUT", "--dport 42000"), 1);
  assert.match(iptables.chains.get(`nat:${dispatch}-n`)![0], /--to-ports 42000$/);
  // Rules without domains: no steering left.
  await firewall.steer("sb1", ip, bridge, null, []);
  assert.deepEqual(iptables.chains.get("nat:PREROUTING"), []);
  assert.equal(iptables.chains.has(`nat:${dispatch}-n`), false);
  // remove() takes the steering too; removeBridge() the INPUT rule.
  await firewall.steer("sb1", ip, bridge, 41000, []);
  assert.equal(await firewall.remove("sb1"), true);
  assert.deepEqual(iptables.chains.get("nat:PREROUTING"), []);
  assert.equal(iptables.chains.has(`nat:${dispatch}-n`), false);
  await firewall.removeBridge(bridge);
  assert.equal(iptables.count("INPUT", "dormice:egress-proxy"), 0);
});

Deno.test("EgressFirewall.steer() again never leaves the sandbox's ports 80 and 443 unsteered, at any step", async () => {
  const { iptables, firewall } = setup();
  const ip = "172.30.0.2";
  await firewall.steer("sb1", ip, bridge, 41000, [`${A}/32`, `${B}/32`]);
  const chain = `nat:${firewall.chains("sb1").dispatch}-n`;
  // Checked after every change to the table: the chain always ends its walk in a REDIRECT.
  const steps: string[][] = [];
  iptables.after = () => {
    const rules = iptables.chains.get(chain) ?? [];
    steps.push(rules);
    assert.ok(
      rules.some((r) => r.includes("-j REDIRECT")),
      `unsteered at ${JSON.stringify(rules)}`,
    );
  };
  // An updateNetwork: other allowed addresses, and a restarted node's proxy port.
  await firewall.steer("sb1", ip, bridge, 42000, [`${C}/32`]);
  iptables.after = null;
  assert.ok(steps.length > 0, "the update changed the table");
  assert.deepEqual(iptables.chains.get(chain), [
    `-d ${C}/32 -j RETURN`,
    "-p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 42000",
  ]);
});

Deno.test("EgressFirewall.unlisten() removes a closed port listener's INPUT rule on its bridge only", async () => {
  const { iptables, firewall } = setup();
  const other = "dm-9876543210-e";
  await firewall.steer("sb1", "172.30.0.2", bridge, 41000, [], new Map([[8443, 41001]]));
  await firewall.steer("sb2", "172.30.0.3", bridge, 41000, [], new Map([[8443, 41001]]));
  await firewall.steer("sb3", "172.31.0.2", other, 42000, [], new Map([[8443, 41001]]));
  assert.equal(iptables.count("INPUT", "--dport 41001"), 2);
  await firewall.unlisten([{ iface: bridge, listener: 41001 }]);
  const input = iptables.chains.get("INPUT")!;
  assert.deepEqual(input.filter((r) => r.includes("--dport 41001")).length, 1);
  assert.ok(input.some((r) => r.includes(`-i ${other} `) && r.includes("--dport 41001")));
  // The 80 and 443 listeners' rules stay; again is no error.
  assert.equal(iptables.count("INPUT", "--dport 41000"), 1);
  await firewall.unlisten([{ iface: bridge, listener: 41001 }]);
  assert.equal(iptables.count("INPUT", "--dport 41001"), 1);
  // The bridge goes (its network removed, a node killed before it let go): all its rules go.
  await firewall.removeBridge(other);
  assert.equal(iptables.count("INPUT", `-i ${other} `), 0);
  assert.equal(iptables.count("INPUT", "--dport 41000"), 1);
});
