import assert from "node:assert/strict";
import { DEFAULT_DOCKER_SOCKET, dockerSocketPath } from "./engine.ts";

Deno.test("dockerSocketPath() follows a unix DOCKER_HOST and defaults otherwise", () => {
  const env = (value?: string) => ({ get: () => value });
  assert.equal(
    dockerSocketPath(env("unix:///run/user/1000/docker.sock")),
    "/run/user/1000/docker.sock",
  );
  assert.equal(dockerSocketPath(env()), DEFAULT_DOCKER_SOCKET);
  assert.equal(dockerSocketPath(env("tcp://10.0.0.1:2375")), DEFAULT_DOCKER_SOCKET);
});
