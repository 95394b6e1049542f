/**
 * The fleet page in a real browser: Debian's headless Chromium, driven by
 * puppeteer-core, against a gateway and two nodes running as processes. Log in with the fleet
 * token, see both nodes and the sandboxes created through the API, filter, watch the page
 * refresh itself, follow a sandbox's link, log out. A screenshot is written to
 * `.ci/artifacts/fleet-page.png` (ignored by git) and its path printed, for CI to keep.
 *
 * Off CI a machine without Chromium skips this test, saying so; with CI=true a missing browser
 * fails it (`.ci/run` installs one).
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import puppeteer, { type Page } from "puppeteer-core";
import { postJson } from "./_gateway.ts";
import { fleet } from "./_operator_fleet.ts";

const candidates = [
  Deno.env.get("DORMICE_TEST_CHROMIUM"),
  "/usr/bin/chromium",
  "/usr/bin/chromium-browser",
  "/usr/bin/google-chrome",
].filter((p): p is string => !!p);
const browserPath = candidates.find((p) => {
  try {
    return Deno.statSync(p).isFile;
  } catch {
    return false;
  }
});
const onCi = Deno.env.get("CI") === "true";
if (browserPath === undefined && !onCi) {
  console.log(
    `fleet page browser test skipped: no Chromium at ${candidates.join(", ")} ` +
      "(apt-get install chromium, or set DORMICE_TEST_CHROMIUM)",
  );
}

const screenshotPath = fileURLToPath(new URL("../.ci/artifacts/fleet-page.png", import.meta.url));

/** Clicks `selector` and waits for the navigation it starts. */
async function clickAndWait(page: Page, selector: string): Promise<void> {
  await Promise.all([page.waitForNavigation({ timeout: 15_000 }), page.click(selector)]);
}

Deno.test({
  name:
    "The fleet page in Chromium: log in, nodes and sandboxes, filter, refresh, details, log out",
  ignore: browserPath === undefined && !onCi,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  assert.ok(browserPath, `CI=true and no Chromium at ${candidates.join(", ")}: install chromium`);
  const f = await fleet();
  const browser = await puppeteer.launch({
    executablePath: browserPath,
    headless: true,
    // As root (CI) Chromium refuses its sandbox; the page is our own.
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    const { gateway, token } = f;
    const key = (await gateway.json("createApiKey", { team: "acme" })).body.key as string;
    const made: Record<string, { id: string; nodeId: string }> = {};
    for (const [credential, name] of [[key, "acme-agent-1"], [token, "ops-agent-1"]]) {
      const r = await postJson(gateway.url, credential, "acquireSandbox", { name });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      made[name] = { id: r.body.sandbox.id, nodeId: r.body.sandbox.nodeId };
    }

    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 900 });
    const problems: string[] = [];
    page.on("console", (m) => {
      // The 401s are this test's own: the wrong token, and the data asked after logging out.
      if (m.type() === "error" && !/status of 401/.test(m.text())) problems.push(m.text());
    });
    page.on("pageerror", (e) => problems.push(String(e)));
    // Anything fetched from elsewhere would show here: the page needs nothing but the gateway.
    const origins = new Set<string>();
    page.on("request", (r) => origins.add(new URL(r.url()).origin));

    // The login form; a wrong token is refused on the form itself.
    await page.goto(`${gateway.url}/ui`);
    await page.type('input[name="token"]', "not-the-token");
    await clickAndWait(page, 'button[type="submit"]');
    assert.match(await page.$eval(".error", (e) => e.textContent ?? ""), /not the fleet token/);
    await page.type('input[name="token"]', token);
    await clickAndWait(page, 'button[type="submit"]');
    assert.equal(new URL(page.url()).pathname, "/ui");
    assert.ok(!page.url().includes(token), "no token in the URL");
    const cookie = (await page.cookies()).find((c) => c.name === "dormice_session");
    assert.ok(cookie, "the session cookie is set");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.notEqual(cookie.value, token, "the cookie is a session, not the token");

    // Two nodes, both up, and both sandboxes.
    const nodes = await page.$$eval(
      "tr[data-node]",
      (rows) =>
        rows.map((r) => [r.getAttribute("data-node"), r.querySelector(".up,.down")?.textContent]),
    );
    assert.deepEqual(nodes.sort(), [["node-a", "up"], ["node-b", "up"]]);
    const listed = () =>
      page.$$eval("tr[data-sandbox]", (rows) => rows.map((r) => r.getAttribute("data-sandbox")));
    assert.deepEqual(
      (await listed()).sort(),
      [made["acme-agent-1"].id, made["ops-agent-1"].id].sort(),
    );
    const placements = await page.$eval("#placements", (e) => e.textContent ?? "");
    assert.match(placements, /acme\/acme-agent-1/);
    assert.match(placements, /2 of 2/, "each placement shows its explain");

    // Filter by team.
    await page.select('select[name="team"]', "acme");
    await clickAndWait(page, "#apply-filters");
    assert.deepEqual(await listed(), [made["acme-agent-1"].id]);
    assert.equal(new URL(page.url()).searchParams.get("team"), "acme");

    // The page refreshes itself: a sandbox made now appears without a reload.
    const later = await postJson(gateway.url, key, "acquireSandbox", { name: "acme-agent-2" });
    assert.equal(later.status, 200, JSON.stringify(later.body));
    await page.waitForSelector(`tr[data-sandbox="${later.body.sandbox.id}"]`, { timeout: 15_000 });
    assert.equal(new URL(page.url()).searchParams.get("team"), "acme", "the same page");

    await Deno.mkdir(new URL("../.ci/artifacts/", import.meta.url), { recursive: true });
    await page.screenshot({ path: screenshotPath as `${string}.png`, fullPage: true });
    console.log(`fleet page screenshot: ${screenshotPath}`);

    // A sandbox's details.
    await clickAndWait(page, `tr[data-sandbox="${made["acme-agent-1"].id}"] a`);
    assert.equal(await page.$eval("#sandbox-name", (e) => e.textContent), "acme-agent-1");
    assert.match(
      await page.$eval("#sandbox-node", (e) => e.textContent ?? ""),
      new RegExp(`^${made["acme-agent-1"].nodeId} `),
    );
    assert.match(await page.$eval("#sandbox-deadline", (e) => e.textContent ?? ""), /none/);

    // Log out: the form again, and the page's data is closed.
    await clickAndWait(page, "#logout");
    assert.ok(await page.$('input[name="token"]'), "the login form is back");
    const after = await page.evaluate(async () => (await fetch("/ui/fragments")).status);
    assert.equal(after, 401);

    assert.deepEqual(problems, [], "no script error and no CSP refusal");
    assert.deepEqual([...origins], [gateway.url], "nothing loaded from anywhere else");
  } finally {
    await browser.close();
    await f.stop();
  }
});
