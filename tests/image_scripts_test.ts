/**
 * The image build scripts' shared steps (deploy/images/_common.sh), run by bash under the
 * scripts' own `set -euo pipefail` against a stand-in `docker` on PATH: no engine needed.
 *
 * @module
 */
import assert from "node:assert/strict";

const common = new URL("../deploy/images/_common.sh", import.meta.url).pathname;

/**
 * A `docker` that lists two older builds and refuses to remove the last (a container uses it):
 * the refusal is the loop's last command, as when an engine's only older build is in use.
 */
const fakeDocker = `#!/bin/bash
case "$1 $2" in
  "image ls")
    if [ "$5" = '{{.Tag}} {{.ID}}' ]; then
      printf 'latest aaa\\nbuild-new aaa\\nbuild-old1 bbb\\nbuild-old2 ccc\\n'
    else
      printf 'aaa\\naaa\\nbbb\\nccc\\n'
    fi ;;
  "rmi dormice-x:build-old1") echo "Untagged: dormice-x:build-old1" ;;
  "rmi dormice-x:build-old2") echo "conflict: a container is using it" >&2; exit 1 ;;
  *) echo "unexpected docker $*" >&2; exit 2 ;;
esac
`;

Deno.test("images_evict: an older build a container still uses is kept, and the build goes on", async () => {
  const bin = await Deno.makeTempDir({ prefix: "dormice-fake-docker-" });
  try {
    await Deno.writeTextFile(`${bin}/docker`, fakeDocker, { mode: 0o755 });
    const script = `set -euo pipefail
who=test image=dormice-x:latest
source ${JSON.stringify(common)}
images_repo=dormice-x images_fingerprint=new
images_evict
echo "after evict"`;
    const out = await new Deno.Command("bash", {
      args: ["-c", script],
      env: { PATH: `${bin}:${Deno.env.get("PATH") ?? "/usr/bin:/bin"}` },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr) + stdout);
    assert.match(stdout, /removed the older build dormice-x:build-old1/);
    assert.match(stdout, /kept the older build dormice-x:build-old2: a container still uses it/);
    assert.match(stdout, /after evict/);
  } finally {
    await Deno.remove(bin, { recursive: true });
  }
});
