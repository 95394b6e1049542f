import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseLockedError, openExclusiveDatabase } from "./lock.ts";

Deno.test("openExclusiveDatabase() refuses a second process on the same file", async () => {
  const dir = await Deno.makeTempDir();
  const path = join(dir, "x.db");
  const db = openExclusiveDatabase(path, "DORMICE_GATEWAY_DB");
  try {
    const code = `
      import { openExclusiveDatabase } from ${
      JSON.stringify(new URL("./lock.ts", import.meta.url).href)
    };
      try { openExclusiveDatabase(${
      JSON.stringify(path)
    }, "DORMICE_GATEWAY_DB"); console.log("opened"); }
      catch (e) { console.log(e.name + ": " + e.message); }
    `;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", code],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.match(text, /DatabaseLockedError/);
    assert.match(text, new RegExp(path.replaceAll(".", "\\.")));
    assert.match(text, /DORMICE_GATEWAY_DB/);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("openExclusiveDatabase() opens again once the holder closed", async () => {
  const dir = await Deno.makeTempDir();
  const path = join(dir, "x.db");
  openExclusiveDatabase(path, "V").close();
  const again = openExclusiveDatabase(path, "V");
  again.close();
  await Deno.remove(dir, { recursive: true });
  assert.ok(DatabaseLockedError);
});
