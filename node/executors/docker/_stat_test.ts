import assert from "node:assert/strict";
import { parseStatLines } from "./_stat.ts";

// Real output of LIST_SCRIPT (/tmp/t, depth 2) then STAT_SCRIPT (/), from busybox 1.35 (the
// minimal image) and GNU coreutils 9.1 (the Debian base image): byte for byte the same, since
// no field is quoted (link targets come from readlink, not stat's %N). The names hold a quote,
// a newline, a link with a quote, a relative link, and "/" itself.
const bothStats = `a1ff/4/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/l'k
81a4/1/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/new
line
81a4/0/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/it's
81a4/0/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/plain
41ed/4096/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/d
a1ff/8/0/0/root/root/1796118308/2026-12-01 09:45:08.000000000 +0000//tmp/t/d/up
@81a4\t/tmp/t/it's\tit's\t/tmp/t/l'k
@81a4\t/tmp/t/plain\t../plain\t/tmp/t/d/up
41ed/4096/0/0/root/root/1796120778/2026-12-01 10:26:18.070880769 +0000//
`;

Deno.test("parseStatLines() reads what both images print: odd names, links, '/'", () => {
  const entries = parseStatLines(bothStats);
  assert.deepEqual(
    entries.map((e) => [e.path, e.name, e.type, e.size, e.symlinkTarget, e.targetType]),
    [
      ["/tmp/t/l'k", "l'k", "symlink", 4, "/tmp/t/it's", "file"],
      ["/tmp/t/new\nline", "new\nline", "file", 1, undefined, undefined],
      ["/tmp/t/it's", "it's", "file", 0, undefined, undefined],
      ["/tmp/t/plain", "plain", "file", 0, undefined, undefined],
      ["/tmp/t/d", "d", "dir", 4096, undefined, undefined],
      ["/tmp/t/d/up", "up", "symlink", 8, "/tmp/t/plain", "file"],
      ["/", "/", "dir", 4096, undefined, undefined],
    ],
  );
  assert.deepEqual(
    { mode: entries[2].mode, owner: entries[2].owner, modifiedAt: entries[2].modifiedAt },
    { mode: 0o644, owner: "root", modifiedAt: 1796118308000 },
  );
});

Deno.test("parseStatLines() reads busybox and coreutils records, names or numeric owners", () => {
  const out = [
    "81a4/5/1000/1000/user/user/1700000000/2023-11-14 22:13:20.250000000 +0000//tmp/a",
    // coreutils prints the local offset; the seconds field keeps the time zone out of it.
    "41ed/4096/0/0/root/root/1700000000/2023-11-14 23:13:20.5 +0100//tmp/d",
    "81a4/1/1234/777/UNKNOWN/UNKNOWN/1700000000/2023-11-14 22:13:20 +0000//tmp/orphan",
  ].join("\n") + "\n";
  const [a, d, orphan] = parseStatLines(out);
  assert.deepEqual(
    [a.type, a.size, a.mode, a.owner, a.modifiedAt],
    ["file", 5, 0o644, "user", 1_700_000_000_250],
  );
  assert.deepEqual([d.type, d.size, d.mode, d.modifiedAt], ["dir", 4096, 0o755, 1_700_000_000_500]);
  assert.deepEqual([orphan.owner, orphan.group], ["1234", "777"]);
});

Deno.test("parseStatLines() joins a name with a newline and attaches link records", () => {
  const out = [
    "81a4/1/0/0/root/root/1700000000/x//tmp/two",
    "lines",
    "a1ff/5/0/0/root/root/1700000000/x//tmp/l",
    "a1ff/9/0/0/root/root/1700000000/x//tmp/broken",
    "a1ff/2/0/0/root/root/1700000000/x//tmp/deep",
    "@81a4\t/tmp/f\tf\t/tmp/l",
    "@-\t/nowhere\t/nowhere\t/tmp/broken",
    // readlink -f resolves nothing when the target's directories are missing.
    "@-\t\t../no/dir/x\t/tmp/deep",
  ].join("\n");
  const [two, l, broken, deep] = parseStatLines(out);
  assert.deepEqual([two.path, two.name], ["/tmp/two\nlines", "two\nlines"]);
  assert.deepEqual([l.type, l.targetType, l.targetMode], ["symlink", "file", 0o644]);
  assert.deepEqual([broken.symlinkTarget, broken.targetType], ["/nowhere", undefined]);
  assert.equal(deep.symlinkTarget, "/no/dir/x");
});

// Real output of LIST_SCRIPT (/tmp/t, depth 2) on the Debian base image (getfattr 2.5.1): the
// metadata section after the \001 mark, its paths quoted with octal escapes; `user.other` is
// not metadata and is not asked for.
const withXattrs = "81a4/1/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507 +0000" +
  "//tmp/t/b\\s\n81a4/1/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507 +0000" +
  "//tmp/t/é\n81a4/1/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507 +0000" +
  "//tmp/t/new\nline\n81a4/1/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507 " +
  "+0000//tmp/t/plain\n41ed/4096/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507" +
  " +0000//tmp/t/d\n81a4/1/1000/1000/user/user/1796123660/2026-12-01 11:14:20.665342507 +0000" +
  "//tmp/t/d/m\n\u0001xattrs\n# file: /tmp/t/b\\134s\nuser.e2b.owner=0x616e61\n\n" +
  "# file: /tmp/t/é\nuser.e2b.owner=0x616e61\n\n# file: /tmp/t/new\\012line\n" +
  "user.e2b.owner=0x616e61\n\n# file: /tmp/t/plain\nuser.e2b.owner=0x616e61\n\n" +
  "# file: /tmp/t/d/m\nuser.e2b.note=0x6120623d63\nuser.e2b.owner=0x616e61\n\n";

Deno.test("parseStatLines() attaches getfattr's metadata to its entries, odd names too", () => {
  const ana = { owner: "ana" };
  assert.deepEqual(parseStatLines(withXattrs).map((e) => [e.path, e.metadata]), [
    ["/tmp/t/b\\s", ana],
    ["/tmp/t/é", ana],
    ["/tmp/t/new\nline", ana],
    ["/tmp/t/plain", ana],
    ["/tmp/t/d", undefined],
    ["/tmp/t/d/m", { note: "a b=c", owner: "ana" }],
  ]);
  // An empty listing prints the mark first; the minimal image prints no mark at all.
  assert.deepEqual(parseStatLines("\u0001xattrs\n"), []);
  assert.equal(parseStatLines(bothStats).some((e) => e.metadata), false);
});
