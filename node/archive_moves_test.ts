/**
 * ArchiveMoves' team check: a take-over reads whose sandbox it is from the registry before it
 * pulls anything, so another team's files never reach the node and the refusal destroys
 * nothing; the sandbox's own team takes it over and its move is marked.
 */
import assert from "node:assert/strict";
import { ARCHIVE_RECORD_LABEL, ArchiveMoves } from "./archive_moves.ts";
import { FakeExecutor } from "./executors/fake.ts";
import type { HttpError } from "../shared/http_error.ts";
import type { SandboxRecord } from "./service_contract.ts";

const id = "archivedsbx01";

/** A registry that holds the archive of `id`, pushed by `team-a`, on a free loopback port. */
function fakeRegistry(): { address: string; puts: string[]; server: Deno.HttpServer } {
  const record = JSON.stringify({ id, team: "team-a", name: "n" });
  const puts: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    const path = new URL(req.url).pathname;
    if (/^\/v2\/dormice-archive\/manifests\/[a-z0-9]+\.moved-[0-9a-f]{16}$/.test(path)) {
      if (req.method === "PUT") {
        puts.push(path);
        return new Response(null, { status: 201 });
      }
      return new Response(null, { status: puts.length > 0 ? 200 : 404 });
    }
    if (path === `/v2/dormice-archive/manifests/sha256:m0` && req.method === "DELETE") {
      puts.push(`DELETE ${path}`);
      return new Response(null, { status: 202 });
    }
    if (path === `/v2/dormice-archive/manifests/${id}`) {
      return Response.json({ config: { digest: "sha256:c0" } }, {
        headers: { "docker-content-digest": "sha256:m0" },
      });
    }
    if (path === "/v2/dormice-archive/blobs/sha256:c0") {
      return Response.json({ config: { Labels: { [ARCHIVE_RECORD_LABEL]: record } } });
    }
    return new Response(null, { status: 404 });
  });
  return { address: `127.0.0.1:${server.addr.port}`, puts, server };
}

function movesOn(registry: string) {
  const pulls: string[] = [];
  const destroys: string[] = [];
  const executor = {
    ...new FakeExecutor(),
    kind: "docker",
    pushArchive: () => Promise.resolve(),
    pullArchive: (sandbox: string) => {
      pulls.push(sandbox);
      return Promise.resolve(JSON.stringify({ id, team: "team-a", name: "n" }));
    },
    destroy: (sandbox: string) => {
      destroys.push(sandbox);
      return Promise.resolve();
    },
  } as unknown as FakeExecutor;
  const service = {
    adoptArchived: (record: SandboxRecord) => Promise.resolve(record),
    destroy: () => Promise.resolve(),
    list: () => [],
  };
  const moves = new ArchiveMoves({
    executor,
    service: service as unknown as ConstructorParameters<typeof ArchiveMoves>[0]["service"],
    registry,
    nodeId: "taker",
    timeoutMs: 5_000,
  });
  return { moves, pulls, destroys };
}

Deno.test("a take-over for another team pulls nothing and destroys nothing", async () => {
  const registry = fakeRegistry();
  try {
    const { moves, pulls, destroys } = movesOn(registry.address);
    await assert.rejects(
      moves.adopt(id, "team-b"),
      (e: HttpError) => e.status === 404 && /is not paused to disk in the registry/.test(e.message),
    );
    assert.deepEqual(pulls, [], "another team's files were pulled");
    assert.deepEqual(destroys, []);
    assert.deepEqual(registry.puts, [], "no move marked");
  } finally {
    await registry.server.shutdown();
  }
});

Deno.test("the sandbox's own team takes it over, and its move is marked", async () => {
  const registry = fakeRegistry();
  try {
    const { moves, pulls } = movesOn(registry.address);
    const row = await moves.adopt(id, "team-a");
    assert.equal(row.id, id);
    assert.deepEqual(pulls, [id]);
    // Marked moved, then claimed by deleting what was pushed.
    assert.equal(registry.puts.length, 2);
    assert.match(registry.puts[0], new RegExp(`^/v2/dormice-archive/manifests/${id}\\.moved-`));
    assert.equal(registry.puts[1], "DELETE /v2/dormice-archive/manifests/sha256:m0");
    // Moved: a second take-over elsewhere is refused before the registry's record is read again.
    const elsewhere = movesOn(registry.address);
    await assert.rejects(elsewhere.moves.adopt(id, "team-a"), (e: HttpError) => e.status === 404);
    assert.deepEqual(elsewhere.pulls, []);
  } finally {
    await registry.server.shutdown();
  }
});
