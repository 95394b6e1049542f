import assert from "node:assert/strict";
import { volumeMountSchema } from "./pools.ts";

Deno.test("volumeMountSchema: a mount over the root, /etc or the kernel's filesystems is refused", () => {
  const ok = (mountPath: string) =>
    volumeMountSchema.safeParse({ name: "data", mountPath }).success;
  for (const p of ["/", "//", "/etc", "/etc/", "/proc", "/proc/sys", "/sys", "/dev", "/dev/shm"]) {
    assert.equal(ok(p), false, p);
  }
  for (const p of ["/data/../proc", "/a/./b", "/.."]) assert.equal(ok(p), false, p);
  for (const p of ["/data", "/home/user/data", "/etcd", "/etc/app", "/devices", "/mnt/proc"]) {
    assert.equal(ok(p), true, p);
  }
  const r = volumeMountSchema.safeParse({ name: "data", mountPath: "/proc" });
  assert.match(JSON.stringify(r.error?.issues), /mount it at a directory of its own/);
});
