import assert from "node:assert/strict";
import { decideReadiness, type MissingImage } from "./_fixtures_test.ts";

const missing = (template: string, image: string): MissingImage => ({
  template,
  image,
  message: `Image ${image} of template '${template}' is missing`,
});

Deno.test("decideReadiness() builds each image an answering engine lacks by its script", async () => {
  const built: string[][] = [];
  const answers = [
    { missing: [missing("base", "dormice-base:latest"), missing("minimal", "dormice-minimal:v2")] },
    { missing: [] },
  ];
  const readiness = await decideReadiness({
    probe: () => Promise.resolve(answers.shift()!),
    build: (command) => {
      built.push(command);
      return Promise.resolve({ ok: true });
    },
  });
  assert.deepEqual(readiness, { ready: true });
  assert.deepEqual(built, [
    ["deploy/images/build-base.sh", "dormice-base:latest"],
    ["deploy/images/build-minimal.sh", "dormice-minimal:v2"],
  ]);
});

Deno.test("decideReadiness() names the command to run when a build fails", async () => {
  const readiness = await decideReadiness({
    probe: () => Promise.resolve({ missing: [missing("base", "dormice-base:latest")] }),
    build: () => Promise.resolve({ ok: false, said: "apt-get: permission denied" }),
  });
  assert.equal(readiness.ready, false);
  assert.match(
    !readiness.ready ? readiness.why : "",
    /permission denied.*bash deploy\/images\/build-base\.sh dormice-base:latest/,
  );
});

Deno.test("decideReadiness() builds nothing when an image is not one this project makes", async () => {
  let builds = 0;
  const readiness = await decideReadiness({
    probe: () =>
      Promise.resolve({
        missing: [missing("minimal", "dormice-minimal:latest"), missing("py", "python:3.12")],
      }),
    build: () => {
      builds++;
      return Promise.resolve({ ok: true });
    },
  });
  assert.deepEqual(readiness, {
    ready: false,
    why: "Image python:3.12 of template 'py' is missing",
  });
  assert.equal(builds, 0);
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
