import assert from "node:assert/strict";
import { parseStatLines } from "./_files.ts";

// Real output of `stat -c STAT_FORMAT` with QUOTING_STYLE=literal, from busybox 1.35 (the
// minimal image) and GNU coreutils 9.1 (the Debian base image), for the same paths: a plain
// file, a quote in a name, a newline in a name, a link with quotes, a directory, a relative
// link, and "/" itself.
const busybox = `81a4/0/1796118308/root/root//tmp/t/plain///tmp/t/plain
81a4/0/1796118308/root/root//tmp/t/it's///tmp/t/it's
81a4/1/1796118308/root/root//tmp/t/new
line///tmp/t/new
line
a1ff/4/1796118308/root/root//tmp/t/l'k//'/tmp/t/l'k' -> 'it's'
41ed/4096/1796118308/root/root//tmp/t/d///tmp/t/d
a1ff/8/1796118308/root/root//tmp/t/d/up//'/tmp/t/d/up' -> '../plain'
41ed/4096/1796116385/root/root/////
`;
const gnu = `81a4/0/1796118308/root/root//tmp/t/plain///tmp/t/plain
81a4/0/1796118308/root/root//tmp/t/it's///tmp/t/it's
81a4/1/1796118308/root/root//tmp/t/new
line///tmp/t/new
line
a1ff/4/1796118308/root/root//tmp/t/l'k///tmp/t/l'k -> it's
41ed/4096/1796118308/root/root//tmp/t/d///tmp/t/d
a1ff/8/1796118308/root/root//tmp/t/d/up///tmp/t/d/up -> ../plain
41ed/4096/1796116385/root/root/////
`;

Deno.test("parseStatLines() reads busybox and GNU stat alike: paths, types, link targets", () => {
  for (const [who, output] of [["busybox", busybox], ["GNU", gnu]]) {
    const entries = parseStatLines(output);
    assert.deepEqual(
      entries.map((e) => [e.path, e.name, e.type, e.size, e.symlinkTarget]),
      [
        ["/tmp/t/plain", "plain", "file", 0, undefined],
        ["/tmp/t/it's", "it's", "file", 0, undefined],
        ["/tmp/t/new\nline", "new\nline", "file", 1, undefined],
        ["/tmp/t/l'k", "l'k", "symlink", 4, "it's"],
        ["/tmp/t/d", "d", "dir", 0, undefined],
        ["/tmp/t/d/up", "up", "symlink", 8, "../plain"],
        ["/", "/", "dir", 0, undefined],
      ],
      who,
    );
    assert.deepEqual(
      { mode: entries[0].mode, owner: entries[0].owner, modifiedAt: entries[0].modifiedAt },
      { mode: 0o644, owner: "root", modifiedAt: 1796118308000 },
      who,
    );
  }
});
