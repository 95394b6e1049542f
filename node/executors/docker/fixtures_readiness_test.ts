import assert from "node:assert/strict";
import { decideReadiness } from "./_fixtures_test.ts";

Deno.test("decideReadiness() builds the images an answering engine lacks, then runs", async () => {
  let builds = 0;
  const answers = [{ missing: ["Image dormice-base:latest is missing"] }, { missing: [] }];
  const readiness = await decideReadiness({
    probe: () => Promise.resolve(answers.shift()!),
    build: () => {
      builds++;
      return Promise.resolve({ ok: true });
    },
  });
  assert.deepEqual(readiness, { ready: true });
  assert.equal(builds, 1);
});

Deno.test("decideReadiness() names the command to run when the build fails", async () => {
  const readiness = await decideReadiness({
    probe: () => Promise.resolve({ missing: ["Image dormice-base:latest is missing"] }),
    build: () => Promise.resolve({ ok: false, said: "apt-get: permission denied" }),
  });
  assert.equal(readiness.ready, false);
  assert.match(
    !readiness.ready ? readiness.why : "",
    /permission denied.*bash deploy\/images\/build-base\.sh/,
  );
});

Deno.test("decideReadiness() does not build when the engine is down", async () => {
  let builds = 0;
  const readiness = await decideReadiness({
    probe: () => Promise.resolve({ down: "no engine on /var/run/docker.sock" }),
    build: () => {
      builds++;
      return Promise.resolve({ ok: true });
    },
  });
  assert.deepEqual(readiness, { ready: false, why: "no engine on /var/run/docker.sock" });
  assert.equal(builds, 0);
});

Deno.test("decideReadiness() runs at once when nothing is missing", async () => {
  let builds = 0;
  const readiness = await decideReadiness({
    probe: () => Promise.resolve({ missing: [] }),
    build: () => {
      builds++;
      return Promise.resolve({ ok: true });
    },
  });
  assert.deepEqual(readiness, { ready: true });
  assert.equal(builds, 0);
});
