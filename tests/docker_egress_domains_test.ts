/**
 * Domain rules and header transforms on Docker, end to end through a gateway with the official
 * SDK, against a stand-in internet: a network namespace with two addresses A and B, each
 * serving HTTP on 80 and HTTPS on 443 (a certificate for `allowed.test` and `other.test` signed
 * by a test CA the node trusts through `DORMICE_EGRESS_EXTRA_CA`), answering with the address
 * it was reached at, the Host it was asked for, a per-run nonce and a digest of the
 * `X-Dormice-Key` header it got (never the value). The node resolves `allowed.test` and
 * `other.test` to A through `DORMICE_EGRESS_HOSTS`; sandboxes connect wherever curl's
 * `--resolve` says, which is how a sandbox forges an address.
 *
 * Checked: a domain rule admits allowed.test and refuses other.test at the same address over
 * HTTP (Host) and HTTPS (SNI); naming allowed.test while connecting to B (forbidden) reaches A,
 * never B; a header rule adds its header over HTTPS with the sandbox trusting the fleet CA
 * without `-k`, and the value is nowhere inside the sandbox, the logs, the node's metrics or the
 * sandbox detail;
 * `updateNetwork` flips the domain rules of a running sandbox; a sandbox with egress and no
 * rules is steered nowhere and gets no header; an upstream's redirect to another domain goes back
 * to the sandbox unfollowed, so the header stays behind; another Host inside a spliced connection
 * reaches the allowed name's server (fronting, documented) and is replaced in an opened one; UDP to an allowed domain's address (QUIC)
 * is refused under deny-all; `updateNetwork` dropping a port's key stops steering that port and
 * naming it again steers it anew; `updateNetwork` cuts an open connection to a domain it no longer
 * allows, and an opened HTTPS connection's next request gets a 403 instead of the header.
 *
 * Needs root, `ip`, iptables, openssl, an engine and the base image (its curl): with
 * `CI=true` a missing one fails the suite; off CI it skips with a printed reason. Names start
 * with `egd`; everything made is removed in `finally`.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { ALL_TRAFFIC, CommandExitError, Sandbox, type SandboxOpts } from "e2b";
import { startGateway } from "./_gateway.ts";
import { freeSubnet, must, netnsReadiness, run, serveInNetns } from "./support/netns.ts";
import { makeCertificates } from "../shared/_tls_fixtures_test.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const FORWARD = "/proc/sys/net/ipv4/ip_forward";

const docker = await dockerGate("docker egress domains test");
const why = docker.skip ? null : await netnsReadiness();
const onCi = Deno.env.get("CI") === "true";
if (why !== null && !onCi) console.log(`docker egress domains test skipped: ${why}`);

const sha = (text: string) => createHash("sha256").update(text).digest("hex").slice(0, 16);

Deno.test({
  name: "docker egress domains: Host and SNI judged, forged addresses useless, headers added " +
    "over the fleet CA, updateNetwork live",
  ignore: docker.skip || (why !== null && !onCi),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (docker.failure) throw new Error(docker.failure);
  if (why !== null) {
    throw new Error(`CI=true, so the docker egress domains test must run, but ${why}`);
  }
  const tag = crypto.randomUUID().slice(0, 6);
  const ns = `egd-${tag}`;
  const hostEnd = `egd${tag}h`;
  const nsEnd = `egd${tag}n`;
  const nonce = `egd-${crypto.randomUUID()}`;
  const secret = `egd-secret-${crypto.randomUUID()}`;
  const nodeId = `egd-${tag}`;
  const dir = await Deno.makeTempDir({ prefix: "egd-" });
  const forwardBefore = (await must("sh", "-c", `cat ${FORWARD}`)).trim();
  let server: Deno.ChildProcess | undefined;
  let node: DockerNodeProcess | undefined;
  let gw: Awaited<ReturnType<typeof startGateway>> | undefined;
  const sandboxes: Sandbox[] = [];
  try {
    const { host, a, b } = await freeSubnet();
    // The test CA and the stand-in's certificate for both names.
    const certs = await makeCertificates(["allowed.test", "other.test"]);
    await Deno.writeTextFile(`${dir}/ca.crt`, certs.ca);
    await Deno.writeTextFile(`${dir}/srv.crt`, certs.cert);
    await Deno.writeTextFile(`${dir}/srv.key`, certs.key);
    await Deno.remove(certs.dir, { recursive: true });

    await must("ip", "netns", "add", ns);
    await must("ip", "link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd);
    await must("ip", "link", "set", nsEnd, "netns", ns);
    await must("ip", "addr", "add", `${host}/29`, "dev", hostEnd);
    await must("ip", "link", "set", hostEnd, "up");
    await must("ip", "-n", ns, "addr", "add", `${a}/29`, "dev", nsEnd);
    await must("ip", "-n", ns, "addr", "add", `${b}/29`, "dev", nsEnd);
    await must("ip", "-n", ns, "link", "set", nsEnd, "up");
    await must("ip", "-n", ns, "route", "add", "default", "via", host);
    if (forwardBefore !== "1") await must("sh", "-c", `echo 1 > ${FORWARD}`);
    const serverFile = `${dir}/server.ts`;
    await Deno.writeTextFile(
      serverFile,
      `import { createHash } from "node:crypto";
       import { gzipSync } from "node:zlib";
       const cert = Deno.readTextFileSync("${dir}/srv.crt");
       const key = Deno.readTextFileSync("${dir}/srv.key");
       for (const hostname of ["${a}", "${b}"]) {
         const answer = (req: Request) => {
           const k = req.headers.get("x-dormice-key");
           const digest = k === null ? "none" : createHash("sha256").update(k).digest("hex").slice(0, 16);
           const text = \`\${hostname} ${nonce} \${new URL(req.url).hostname} key=\${digest}\n\`;
           // /redirect: to other.test, the way an upstream may send a client elsewhere.
           if (new URL(req.url).pathname === "/redirect") {
             return new Response(text, { status: 302, headers: { location: "https://other.test/" } });
           }
           // /gz: gzip whenever the request accepts it, as many servers do.
           if (new URL(req.url).pathname === "/gz" && /gzip/.test(req.headers.get("accept-encoding") ?? "")) {
             return new Response(gzipSync(new TextEncoder().encode(text)), {
               headers: { "content-encoding": "gzip" },
             });
           }
           return new Response(text);
         };
         Deno.serve({ hostname, port: 80, onListen() {} }, answer);
         Deno.serve({ hostname, port: 443, cert, key, onListen() {} }, answer);
         // HTTPS on another port too, for transform keys with a port.
         Deno.serve({ hostname, port: 8443, cert, key, onListen() {} }, answer);
       }
       console.log("listening");`,
    );
    server = await serveInNetns(
      ns,
      ["--allow-net", `--allow-read=${dir}`],
      serverFile,
      "the stand-in internet",
    );

    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const dataDir = `${dir}/node`;
    await Deno.mkdir(dataDir);
    await Deno.copyFile(`${dir}/ca.crt`, `${dataDir}/upstream-ca.crt`);
    node = await startDockerNode({
      token: gw.token,
      gatewayUrl: gw.url,
      nodeId,
      dataDir,
      env: {
        DORMICE_EGRESS_EXTRA_CA: `${dataDir}/upstream-ca.crt`,
        // unverified.test: at A too, whose certificate does not name it.
        DORMICE_EGRESS_HOSTS: `allowed.test=${a},other.test=${a},unverified.test=${a}`,
      },
    });
    await until("the docker node to be up at the gateway, enforcing rules", async () => {
      const { body } = await gw!.json("listNodes");
      return body.nodes.some((n: { id: string; state: string; egressRules: boolean }) =>
        n.id === nodeId && n.state === "up" && n.egressRules === true
      );
    }, 30_000);
    const opts = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: gw.token,
      timeoutMs: 120_000,
    };
    const create = async (options: Partial<SandboxOpts>) => {
      const sandbox = await Sandbox.create({ ...opts, ...options });
      sandboxes.push(sandbox);
      // The test CA, for HTTPS the proxy splices (the sandbox sees the stand-in's certificate).
      await sandbox.files.write("/tmp/egd-ca.crt", await Deno.readTextFile(`${dir}/ca.crt`));
      return sandbox;
    };
    /** What `sandbox` gets for `name` over `scheme`, connecting to `address`. */
    const get = async (
      sandbox: Sandbox,
      scheme: "http" | "https",
      name: string,
      address: string,
      cacert = true,
      path = "/",
      port = scheme === "http" ? 80 : 443,
    ): Promise<string> => {
      const authority = port === 80 || port === 443 ? name : `${name}:${port}`;
      try {
        const r = await sandbox.commands.run(
          `curl -sS --compressed --max-time 6 ${cacert ? "--cacert /tmp/egd-ca.crt " : ""}` +
            `--resolve ${name}:${port}:${address} ${scheme}://${authority}${path}`,
          { timeoutMs: 20_000 },
        );
        return r.stdout.trim();
      } catch (error) {
        if (error instanceof CommandExitError) return `refused: ${error.exitCode}`;
        throw error;
      }
    };
    const answer = (at: string, name: string, key = "none") => `${at} ${nonce} ${name} key=${key}`;

    const open = await create({ allowInternetAccess: true });
    await t.step(
      "precondition: a sandbox with egress and no rules reaches A and B by both names",
      async () => {
        for (const scheme of ["http", "https"] as const) {
          assert.equal(await get(open, scheme, "allowed.test", a), answer(a, "allowed.test"));
          assert.equal(await get(open, scheme, "other.test", b), answer(b, "other.test"));
        }
      },
    );

    const ruled = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ["allowed.test"] } });
    await t.step(
      "allowOut [allowed.test]: allowed.test answers, other.test at the same address does not, over HTTP and HTTPS",
      async () => {
        assert.equal(await get(ruled, "http", "allowed.test", a), answer(a, "allowed.test"));
        assert.equal(await get(ruled, "https", "allowed.test", a), answer(a, "allowed.test"));
        assert.match(
          await get(ruled, "http", "other.test", a),
          /^dormice egress: .*deny other\.test/,
        );
        assert.match(await get(ruled, "https", "other.test", a), /^refused: /);
      },
    );

    await t.step(
      "naming allowed.test while connecting to B (forbidden) reaches A, never B",
      async () => {
        assert.equal(await get(ruled, "http", "allowed.test", b), answer(a, "allowed.test"));
        assert.equal(await get(ruled, "https", "allowed.test", b), answer(a, "allowed.test"));
        // B itself, by address, is refused on every port.
        assert.match(await get(ruled, "http", b, b), /^dormice egress: .*deny|^refused: /);
      },
    );

    await t.step("updateNetwork flips the domain rules of the running sandbox", async () => {
      await ruled.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ["other.test"] });
      assert.equal(await get(ruled, "https", "other.test", a), answer(a, "other.test"));
      assert.match(await get(ruled, "https", "allowed.test", a), /^refused: /);
      assert.match(await get(ruled, "http", "allowed.test", a), /^dormice egress: /);
      const info = await Sandbox.getInfo(ruled.sandboxId, opts);
      assert.deepEqual(info.network?.allowOut, ["other.test"]);
    });

    const keyed = await create({
      network: {
        allowOut: ["allowed.test"],
        denyOut: [ALL_TRAFFIC],
        rules: { "allowed.test": [{ transform: { headers: { "X-Dormice-Key": secret } } }] },
      },
    });
    await t.step(
      "a header rule adds its header over HTTPS, the sandbox trusting the fleet CA without -k",
      async () => {
        assert.equal(
          await get(keyed, "https", "allowed.test", a, false),
          answer(a, "allowed.test", sha(secret)),
        );
        // A compressed answer reaches the sandbox intact (curl --compressed asks for gzip).
        assert.equal(
          await get(keyed, "https", "allowed.test", a, false, "/gz"),
          answer(a, "allowed.test", sha(secret)),
        );
        // The precondition: the stand-in does compress /gz for a client that asks.
        const direct = await open.commands.run(
          `curl -sS --compressed -D - -o /dev/null --cacert /tmp/egd-ca.crt --resolve ` +
            `allowed.test:443:${a} https://allowed.test/gz`,
          { timeoutMs: 20_000 },
        );
        assert.match(direct.stdout, /content-encoding: gzip/i);
        // Forged address: the header still goes to allowed.test's address only.
        assert.equal(
          await get(keyed, "https", "allowed.test", b, false),
          answer(a, "allowed.test", sha(secret)),
        );
      },
    );

    const other = `egd-other-${crypto.randomUUID()}`;
    const ported = await create({
      network: {
        allowOut: ["allowed.test"],
        denyOut: [ALL_TRAFFIC],
        rules: {
          // A sandbox's own host:port key, as the SDK's getHost() gives one off 443.
          "allowed.test:8443": [{ transform: { headers: { "X-Dormice-Key": secret } } }],
          "allowed.test": [{ transform: { headers: { "X-Dormice-Key": other } } }],
        },
      },
    });
    await t.step(
      "a rule key with a port applies on that port (steered there), a key without one on 443",
      async () => {
        assert.equal(
          await get(ported, "https", "allowed.test", a, false, "/", 8443),
          answer(a, "allowed.test", sha(secret)),
        );
        assert.equal(
          await get(ported, "https", "allowed.test", a, false),
          answer(a, "allowed.test", sha(other)),
        );
        // Forged address on the port: the header still goes to allowed.test's address only.
        assert.equal(
          await get(ported, "https", "allowed.test", b, false, "/", 8443),
          answer(a, "allowed.test", sha(secret)),
        );
        const info = await Sandbox.getInfo(ported.sandboxId, opts);
        assert.deepEqual(Object.keys(info.network?.rules ?? {}).sort(), [
          "allowed.test",
          "allowed.test:8443",
        ]);
      },
    );

    await t.step(
      "updateNetwork dropping a port's key stops steering it; naming it again steers it anew",
      async () => {
        const unported = {
          allowOut: ["allowed.test"],
          denyOut: [ALL_TRAFFIC],
          rules: { "allowed.test": [{ transform: { headers: { "X-Dormice-Key": other } } }] },
        };
        await ported.updateNetwork(unported);
        // 8443 goes direct now, where deny-all refuses it; 443 is still steered.
        assert.match(await get(ported, "https", "allowed.test", a, false, "/", 8443), /^refused: /);
        assert.equal(
          await get(ported, "https", "allowed.test", a, false),
          answer(a, "allowed.test", sha(other)),
        );
        // No sandbox named 8443 in between: its listener was released, and one opens again.
        await ported.updateNetwork({
          ...unported,
          rules: {
            ...unported.rules,
            "allowed.test:8443": [{ transform: { headers: { "X-Dormice-Key": secret } } }],
          },
        });
        assert.equal(
          await get(ported, "https", "allowed.test", a, false, "/", 8443),
          answer(a, "allowed.test", sha(secret)),
        );
      },
    );

    await t.step(
      "the header value is nowhere inside the sandbox, nor in logs, metrics or the detail",
      async () => {
        const [x, y] = [secret.slice(0, 20), secret.slice(20)];
        // The search itself works: X, a half of the value, is in the command's environment.
        const r = await keyed.commands.run(
          'env | grep -cF "$X"; s="$X$Y"; env | grep -cF "$s"; ' +
            'grep -rlsF "$s" /etc /home /root /tmp /var /opt /usr/local 2>/dev/null | head -5; true',
          { envs: { X: x, Y: y }, timeoutMs: 60_000, user: "root" },
        );
        assert.equal(r.stdout.trim(), "1\n0", r.stdout);
        const logs = node!.process.stdout() + node!.process.stderr();
        assert.ok(logs.includes(nodeId), "the node's log was captured");
        assert.ok(!logs.includes(secret), "the node's log holds the value");
        const gatewayLogs = gw!.process.stdout() + gw!.process.stderr();
        assert.ok(gatewayLogs.length > 0, "the gateway's log was captured");
        assert.ok(!gatewayLogs.includes(secret), "the gateway's log holds the value");
        // Nor the node's metrics (labels or values), nor the sandbox detail.
        const metrics = await fetch(`${node!.url}/metrics`, {
          headers: { authorization: `Bearer ${gw!.token}` },
        });
        assert.equal(metrics.status, 200);
        assert.ok(!(await metrics.text()).includes(secret), "the node's metrics hold the value");
        const info = await Sandbox.getInfo(keyed.sandboxId, opts);
        assert.ok(!JSON.stringify(info).includes(secret), "the sandbox detail holds the value");
      },
    );

    await t.step(
      "rules never leak: the open sandbox is steered nowhere and gets no header",
      async () => {
        // Two ruled sandboxes on one bridge, each by its own rules: ruled now allows other.test
        // only, keyed allowed.test only (with its header), and neither gets the other's.
        assert.equal(await get(ruled, "https", "other.test", a), answer(a, "other.test"));
        assert.match(await get(keyed, "https", "other.test", a, false), /^refused: /);
        assert.equal(
          await get(keyed, "https", "allowed.test", a, false),
          answer(a, "allowed.test", sha(secret)),
        );
        assert.equal(await get(open, "https", "allowed.test", a), answer(a, "allowed.test"));
        assert.equal(await get(open, "http", "other.test", b), answer(b, "other.test"));
        assert.equal(await get(open, "https", "other.test", b), answer(b, "other.test"));
      },
    );

    await t.step(
      "an upstream's redirect elsewhere is the sandbox's to follow: the header stays behind",
      async () => {
        const both = await create({
          network: {
            allowOut: ["allowed.test", "other.test"],
            denyOut: [ALL_TRAFFIC],
            rules: { "allowed.test": [{ transform: { headers: { "X-Dormice-Key": secret } } }] },
          },
        });
        // Trusting both the fleet CA (the system store: allowed.test is opened) and the test CA
        // (other.test is spliced: the stand-in's own certificate).
        await both.commands.run(
          "cat /etc/ssl/certs/ca-certificates.crt /tmp/egd-ca.crt > /tmp/egd-both.crt",
        );
        const follow = (flags: string) =>
          both.commands.run(
            `curl -sS --max-time 6 ${flags} --cacert /tmp/egd-both.crt ` +
              `--resolve allowed.test:443:${a} ` +
              `--resolve other.test:443:${a} https://allowed.test/redirect`,
            { timeoutMs: 20_000 },
          );
        // The precondition: the first hop carries the header and answers 302.
        const first = await follow("-i");
        assert.match(first.stdout, /^HTTP\/[\d.]+ 302/);
        assert.match(first.stdout, /location: https:\/\/other\.test\//i);
        assert.ok(first.stdout.includes(answer(a, "allowed.test", sha(secret))), first.stdout);
        // Followed by the sandbox (the proxy never follows one), other.test gets no header.
        assert.equal((await follow("-L")).stdout.trim(), answer(a, "other.test"));
      },
    );

    await t.step(
      "another Host inside: spliced, it reaches the allowed name's server; opened, it is replaced",
      async () => {
        const inside = async (sandbox: Sandbox, name: string, host: string, cacert: boolean) =>
          (await sandbox.commands.run(
            `curl -sS --max-time 6 ${cacert ? "--cacert /tmp/egd-ca.crt " : ""}` +
              `-H 'Host: ${host}' --resolve ${name}:443:${b} https://${name}/`,
            { timeoutMs: 20_000 },
          )).stdout.trim();
        // ruled allows other.test only (since its update): the name other.test's server (A)
        // answers the Host it is asked for, as a server with many names does. Never B.
        assert.equal(
          await inside(ruled, "other.test", "allowed.test", true),
          answer(a, "allowed.test"),
        );
        // keyed's opened connection: the proxy's request names allowed.test, header and all.
        assert.equal(
          await inside(keyed, "allowed.test", "other.test", false),
          answer(a, "allowed.test", sha(secret)),
        );
      },
    );

    await t.step(
      "the proxy verifies the upstream: a certificate not naming the domain gets no header",
      async () => {
        const spoofed = await create({
          network: {
            allowOut: ["unverified.test"],
            denyOut: [ALL_TRAFFIC],
            rules: { "unverified.test": [{ transform: { headers: { "X-Dormice-Key": secret } } }] },
          },
        });
        const r = await spoofed.commands.run(
          `curl -sS --max-time 10 -w ' %{http_code}' --resolve unverified.test:443:${a} ` +
            "https://unverified.test/",
          { timeoutMs: 30_000 },
        );
        assert.match(r.stdout, /^dormice egress: unverified\.test could not be reached: /);
        assert.match(r.stdout, / 502$/);
        assert.ok(!r.stdout.includes(nonce), "the stand-in answered");
      },
    );

    await t.step(
      "UDP to an allowed domain's address (QUIC on 443) is refused under deny-all, by the kernel",
      async () => {
        // A connected UDP socket learns of the refusal from the ICMP answer: EHOSTUNREACH (113)
        // for the rule's admin-prohibited, ECONNREFUSED (111) for a port nobody listens on.
        const probe = (sandbox: Sandbox) =>
          sandbox.commands.run(
            `python3 -c 'import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("${a}", 443))
try:
    s.send(b"q"); time.sleep(0.5); s.send(b"q"); time.sleep(0.5); s.recv(10); print("answered")
except OSError as e:
    print(e.errno)'`,
            { timeoutMs: 20_000 },
          );
        assert.equal((await probe(open)).stdout.trim(), "111", "precondition: reached, unserved");
        assert.equal((await probe(keyed)).stdout.trim(), "113");
      },
    );

    await t.step(
      "updateNetwork cuts an open connection to a domain it no longer allows, and no header " +
        "goes on an opened one after",
      async () => {
        const live = await create({
          network: {
            allowOut: ["allowed.test"],
            denyOut: [ALL_TRAFFIC],
            rules: { "allowed.test": [{ transform: { headers: { "X-Dormice-Key": secret } } }] },
          },
        });
        // One keep-alive connection each over HTTP and HTTPS (the fleet CA from the system
        // store), a request on it, then a second once the test says go.
        await live.files.write(
          "/tmp/keep.py",
          `import http.client, os, socket, ssl, sys, time
scheme, addr, out = sys.argv[1:4]
def log(line):
    with open(out, "a") as f:
        f.write(line + "\\n")
if scheme == "https":
    c = http.client.HTTPSConnection("allowed.test", 443, timeout=10)
    c.sock = ssl.create_default_context().wrap_socket(
        socket.create_connection((addr, 443), 10), server_hostname="allowed.test")
else:
    c = http.client.HTTPConnection(addr, 80, timeout=10)
def ask():
    try:
        c.request("GET", "/", headers={"Host": "allowed.test"})
        r = c.getresponse()
        log(f"{r.status} {r.read().decode().strip()}")
    except Exception as e:
        log(f"cut {type(e).__name__}")
ask()
while not os.path.exists(out + ".go"):
    time.sleep(0.1)
ask()
`,
        );
        for (const scheme of ["http", "https"]) {
          await live.commands.run(`python3 /tmp/keep.py ${scheme} ${a} /tmp/${scheme}.out`, {
            background: true,
          });
        }
        const lines = async (scheme: string) =>
          (await live.files.read(`/tmp/${scheme}.out`).catch(() => "")).trim().split("\n")
            .filter((l) => l !== "");
        await until(
          "both first requests to be answered",
          async () => (await lines("http")).length === 1 && (await lines("https")).length === 1,
          20_000,
        );
        // The precondition: both connections work, the HTTPS one with the header added.
        assert.deepEqual(await lines("http"), [`200 ${answer(a, "allowed.test")}`]);
        assert.deepEqual(await lines("https"), [`200 ${answer(a, "allowed.test", sha(secret))}`]);
        // allowed.test is no longer allowed; its transform stays (it grants nothing).
        await live.updateNetwork({
          allowOut: ["other.test"],
          denyOut: [ALL_TRAFFIC],
          rules: { "allowed.test": [{ transform: { headers: { "X-Dormice-Key": secret } } }] },
        });
        await live.files.write("/tmp/http.out.go", "");
        await live.files.write("/tmp/https.out.go", "");
        await until(
          "both second requests to end",
          async () => (await lines("http")).length === 2 && (await lines("https")).length === 2,
          20_000,
        );
        assert.match((await lines("http"))[1], /^cut /);
        assert.match((await lines("https"))[1], /^403 dormice egress: .*deny allowed\.test now/);
      },
    );
  } finally {
    for (const sandbox of sandboxes) await sandbox.kill().catch(() => {});
    await node?.stop();
    await gw?.stop();
    await removeContainersOf([nodeId]);
    try {
      server?.kill("SIGKILL");
      await server?.status;
    } catch { /* exited already */ }
    await server?.stdout.cancel().catch(() => {});
    await run("ip", ["netns", "del", ns]).catch(() => {});
    await run("ip", ["link", "del", hostEnd]).catch(() => {});
    if (forwardBefore !== "1") await run("sh", ["-c", `echo ${forwardBefore} > ${FORWARD}`]);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
