// Browser test for weir's dashboard, run by server/dashboard/e2e_test.go
// against a real `weir serve`. It drives Debian's /usr/bin/chromium through
// playwright-core (no browser download).
//
// Environment:
//   WEIR_URL           base URL of the running service, e.g. http://127.0.0.1:38080
//   WEIR_ADMIN_TOKEN   the admin token the service was started with
//   WEIR_SCREENSHOT    where to write the 1280×800 screenshot
//   WEIR_SHOT_DIR      where to write the extra screenshots (phone width, dark)
//   WEIR_CHART_POINTS  seconds of traffic the chart shows before the screenshot (default 8)
//   CHROMIUM           browser binary (default /usr/bin/chromium)
//
// The service must have these rules: login (sliding_log, 3 per 30m, block
// 30m, identity ip), api, search (shadow) and upload; see e2e_test.go.

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';

const base = (process.env.WEIR_URL || '').replace(/\/$/, '');
const token = process.env.WEIR_ADMIN_TOKEN || '';
const shot = process.env.WEIR_SCREENSHOT || '';
const shotDir = process.env.WEIR_SHOT_DIR || '';
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
if (!base || !token) {
  console.error('WEIR_URL and WEIR_ADMIN_TOKEN must be set');
  process.exit(2);
}

const TARGET = '198.51.100.23'; // the identity this test gets blocked and unblocks
const ATTACKER = '203.0.113.77'; // stays blocked, so the screenshot shows a countdown
const t0 = Date.now();
const problems = [];
const log = (...a) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s]`, ...a);

function fail(msg) {
  throw new Error(msg);
}

let slowest = 0;
async function check(rule, key, hits = 1) {
  const start = performance.now();
  const r = await fetch(`${base}/v1/check`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ rule, key, hits }),
  });
  const text = await r.text();
  slowest = Math.max(slowest, performance.now() - start);
  let body;
  try { body = JSON.parse(text); } catch { fail(`POST /v1/check ${rule}/${key}: status ${r.status}, not JSON: ${text}`); }
  if (r.status !== 200 && r.status !== 429) fail(`POST /v1/check ${rule}/${key}: status ${r.status}: ${text}`);
  return body;
}

// ---- background traffic, about 10 ticks a second: steady legitimate use
// that rises and falls, a scraper that bursts past its limit every 15 s, a
// crawler counted by the shadow rule, and a password-guesser held in the
// penalty box.
let stopTraffic = false;
let sent = 0;
let inflight = 0;
async function traffic() {
  let tick = 0;
  let loginSeq = 0;
  const keys = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot'];
  while (!stopTraffic) {
    tick++;
    const sec = tick / 10;
    const jobs = [];
    const p = 0.16 + 0.06 * Math.sin(sec / 6); // legitimate load: 1..2.2 checks per key per second, under the limit
    for (const k of keys) if (Math.random() < p) jobs.push(check('api', `key-${k}`));
    if (sec % 15 < 6) jobs.push(check('api', 'key-scraper'), check('api', 'key-scraper')); // 20/s for 6 s: the burst of 20 passes, then 3/s
    if (Math.random() < 0.25) jobs.push(check('search', `192.0.2.${10 + (tick % 40)}`));
    if (tick % 4 === 0) jobs.push(check('search', '192.0.2.99')); // shadow-limited
    if (tick % 8 === 0) jobs.push(check('login', `10.1.${Math.floor(loginSeq / 200)}.${loginSeq++ % 200}`));
    if (tick % 4 === 0) jobs.push(check('login', ATTACKER));
    if (tick % 12 === 0) jobs.push(check('upload', `user-${(tick / 12) % 3}`));
    // Not awaited: one slow answer must not stall the traffic (and dent the chart).
    inflight += jobs.length;
    sent += jobs.length;
    for (const j of jobs) j.catch((e) => problems.push(`traffic: ${e.message}`)).finally(() => { inflight--; });
    await new Promise((r) => setTimeout(r, 100));
    while (inflight > 64 && !stopTraffic) await new Promise((r) => setTimeout(r, 20));
  }
  while (inflight > 0) await new Promise((r) => setTimeout(r, 20));
}

// Timeouts are generous: `make test` runs this beside other suites on two cores.
async function waitFor(what, fn, timeoutMs = 30000, everyMs = 200) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
  fail(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let trafficDone;
try {
  trafficDone = traffic().catch((e) => { problems.push(`traffic: ${e.message}`); });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, colorScheme: 'light', deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => {
    // A poll the page gave up on (its own timeout) is not a fault of the page;
    // a stalled service would fail the checks below.
    if (r.url().endsWith('/v1/dashboard/snapshot') && /ABORTED/.test(r.failure()?.errorText || '')) return;
    problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  page.on('response', (r) => {
    const u = new URL(r.url());
    if (r.status() >= 400 && !u.pathname.startsWith('/v1/')) problems.push(`HTTP ${r.status()} for ${u.pathname}`);
  });

  const resp = await page.goto(`${base}/`, { waitUntil: 'load' });
  if (!resp || resp.status() !== 200) fail(`GET / gave ${resp && resp.status()}`);
  const csp = resp.headers()['content-security-policy'] || '';
  if (!/script-src 'self'/.test(csp) || /unsafe-inline/.test(csp)) fail(`weak or missing CSP: ${csp}`);
  log('page loaded');

  // Every section is there.
  for (const id of ['decisions-chart', 'rules-table', 'top-limited', 'blocked-list', 'store-health', 'try-it']) {
    await page.locator(`[data-testid="${id}"]`).waitFor({ state: 'visible', timeout: 20000 });
  }
  const rules = page.locator('[data-testid="rules-table"]');
  await waitFor('rules in the table', async () => (await rules.locator('tbody tr').count()) >= 4);
  for (const r of ['login', 'api', 'search', 'upload']) {
    if ((await rules.locator(`tr[data-rule="${r}"]`).count()) !== 1) fail(`rule ${r} missing from rules-table`);
  }
  const loginRow = await rules.locator('tr[data-rule="login"]').innerText();
  for (const want of ['sliding_log', '3/30m']) if (!loginRow.includes(want)) fail(`login row lacks ${want}: ${loginRow}`);
  if ((await rules.locator('tr[data-rule="search"] .badge.shadow').count()) !== 1) fail('search rule not marked shadow');
  if ((await rules.locator('svg.spark').count()) < 4) fail('sparklines missing');
  // login is 3/30m: each client's third attempt leaves it at 100% of the
  // limit, past the default near_limit of 80%, and is admitted.
  await waitFor('a near-limit count for login', async () => /^[1-9]/.test(await rules.locator('tr[data-rule="login"] td.near').innerText()));
  const storeText = await page.locator('[data-testid="store-health"]').innerText();
  if (!/in-memory|memory/.test(storeText) || !/breaker closed/.test(storeText)) fail(`store-health: ${storeText}`);
  if (!/Fallback decisions\s*0 · 0 in 5 min/.test(storeText)) fail(`store-health lacks the fallback decisions: ${storeText}`);
  if (!/Deny cache\s*off/.test(storeText)) fail(`store-health lacks the deny cache (off on a memory store): ${storeText}`);
  log('rules and store health rendered');

  // Overload protection: the adaptive rule counts the checks this test
  // sends; the breaker rule shows its state.
  const prot = page.locator('[data-testid="protect-table"]');
  await waitFor('protect rules counting checks', async () => {
    const t = await prot.innerText();
    return /checks\s+adaptive\s+\d+ \/ \d+/.test(t) && !/checks[^\n]*\t0\t/.test(t);
  });
  const protText = await prot.innerText();
  if (!/payments\s+breaker/.test(protText) || !/closed · 0 transitions/.test(protText)) fail(`protect-table: ${protText}`);
  log('protect rules rendered');

  // The chart's data grows.
  const chartEl = page.locator('[data-testid="decisions-chart"]');
  const attrs = () => chartEl.evaluate((el) => ({
    points: Number(el.dataset.points), updates: Number(el.dataset.updates),
    total: Number(el.dataset.total), last: Number(el.dataset.lastMs),
    plotted: window.weirDashboard.chart.data[0].length,
  }));
  const a0 = await waitFor('first chart data', async () => { const a = await attrs(); return a.updates >= 1 && a.total > 0 ? a : null; });
  const a1 = await waitFor('the chart to grow', async () => {
    const a = await attrs();
    return a.points > a0.points && a.total > a0.total && a.last > a0.last && a.updates > a0.updates ? a : null;
  });
  if (a1.plotted < a1.points) fail(`uPlot holds ${a1.plotted} points, fewer than ${a1.points}`);
  log(`chart grew: points ${a0.points}→${a1.points}, decisions ${a0.total}→${a1.total}, updates ${a0.updates}→${a1.updates}`);

  // Without a token the penalty box is read-only and says so.
  const blocked = page.locator('[data-testid="blocked-list"]');
  if (!(await blocked.innerText()).includes('Read-only')) fail('blocked-list does not say it is read-only');

  // Get TARGET limited and blocked: 3 allowed, then rejected into the penalty box.
  for (let i = 1; i <= 3; i++) {
    const d = await check('login', TARGET);
    if (!d.allowed) fail(`login check ${i} for ${TARGET} was rejected: ${JSON.stringify(d)}`);
  }
  const rejected = await check('login', TARGET);
  if (rejected.allowed) fail(`4th login check for ${TARGET} was allowed: ${JSON.stringify(rejected)}`);
  log('target rejected:', JSON.stringify(rejected));

  // Without the token identities are hidden: TARGET and ATTACKER show as
  // tags (#<16 hex>), in the penalty box and in top-limited alike.
  const TAG = /^#[0-9a-f]{16}$/;
  const loginRows = blocked.locator('li[data-rule="login"]');
  await waitFor('TARGET and ATTACKER in the penalty box, as tags', async () => (await loginRows.count()) >= 2);
  const tags = await loginRows.evaluateAll((els) => els.map((e) => e.dataset.identity));
  if (!tags.every((t) => TAG.test(t))) fail(`penalty box without a token shows ${JSON.stringify(tags)}, want tags`);
  const seen = () => page.evaluate(() => document.body.innerText + JSON.stringify(window.weirDashboard.snapshot));
  for (const who of [TARGET, ATTACKER]) if ((await seen()).includes(who)) fail(`the page shows ${who} without a token`);
  if ((await page.evaluate(() => document.body.dataset.identities)) !== 'redacted') fail('the snapshot is not marked redacted');
  if (!(await page.locator('#admin-note').innerText()).includes('Identities are hidden')) fail('the note does not say identities are hidden');
  const tagRow = loginRows.first();
  if ((await tagRow.locator('button:visible').count()) !== 0) fail('Unblock offered without a token');
  const c1 = await tagRow.locator('.count').innerText();
  if (!/^\d+m \d\ds$/.test(c1)) fail(`countdown looks wrong: ${c1}`);
  await waitFor('the countdown to tick', async () => (await tagRow.locator('.count').innerText()) !== c1, 10000);
  const topTags = await page.locator('[data-testid="top-limited"] [data-rule="login"] li').evaluateAll((els) => els.map((e) => e.dataset.identity));
  if (!topTags.length || !topTags.every((t) => TAG.test(t)) || !topTags.some((t) => tags.includes(t))) {
    fail(`top-limited without a token shows ${JSON.stringify(topTags)}; want the penalty box's tags ${JSON.stringify(tags)}`);
  }
  log(`without a token: ${tags.length} login tags in blocked-list, countdown ${c1}, no identity on the page`);

  // A wrong token is refused, the right one is kept for the tab.
  await page.getByLabel('Admin token').fill('not-the-token');
  await page.getByRole('button', { name: 'Use token' }).click();
  await page.locator('#admin-error').waitFor({ state: 'visible', timeout: 20000 });
  await page.getByLabel('Admin token').fill(token);
  await page.getByLabel('Admin token').press('Enter');
  await page.locator('#admin-set').waitFor({ state: 'visible', timeout: 20000 });
  const stored = await page.evaluate(() => sessionStorage.getItem('weir.adminToken'));
  if (stored !== token) fail('token not kept in sessionStorage');

  // With the token the snapshot shows identities.
  const row = blocked.locator(`li[data-identity="${TARGET}"]`);
  await row.waitFor({ state: 'visible', timeout: 20000 });
  await page.locator(`[data-testid="top-limited"] [data-rule="login"] li[data-identity="${TARGET}"]`)
    .waitFor({ state: 'visible', timeout: 20000 });
  if ((await page.evaluate(() => document.body.dataset.identities)) !== 'full') fail('the snapshot with the token is not full');
  log('with the token: target in top-limited and in blocked-list');

  // Unblock TARGET with the button; it leaves the list and stays gone.
  const unblock = page.getByRole('button', { name: `Unblock ${TARGET} from rule login` });
  await unblock.waitFor({ state: 'visible', timeout: 20000 });
  await unblock.click();
  await row.waitFor({ state: 'detached', timeout: 20000 });
  const u0 = (await attrs()).updates;
  await waitFor('two more refreshes', async () => (await attrs()).updates >= u0 + 2);
  if ((await row.count()) !== 0) fail(`${TARGET} came back to the blocked list after Unblock`);
  const again = await check('login', TARGET);
  if (!again.allowed) fail(`${TARGET} not admitted after Unblock: ${JSON.stringify(again)}`);
  log('unblocked through the page; admitted again:', JSON.stringify(again));

  // Try it, by keyboard: pick a rule, type a key, press Enter.
  const tryIt = page.locator('[data-testid="try-it"]');
  await tryIt.getByLabel('Rule').selectOption('login');
  await tryIt.getByLabel('Key (identity)').fill(ATTACKER);
  await tryIt.getByLabel('Key (identity)').press('Enter');
  await waitFor('a Try-it decision', async () => /Limited/.test(await page.locator('#try-summary').innerText()));
  const hdrs = await page.locator('#try-headers').innerText();
  if (!/RateLimit-Policy/.test(hdrs) || !/Retry-After/.test(hdrs)) fail(`Try it headers: ${hdrs}`);
  const json = JSON.parse(await page.locator('#try-json').innerText());
  if (json.allowed !== false) fail(`Try it JSON: ${JSON.stringify(json)}`);
  await tryIt.getByLabel('Rule').selectOption('api');
  await tryIt.getByLabel('Key (identity)').fill('key-demo');
  await tryIt.getByRole('button', { name: 'Send check' }).click();
  await waitFor('an allowed Try-it decision', async () => /Allowed/.test(await page.locator('#try-summary').innerText()));
  log('try it works');

  // The chart follows the rule selector.
  await page.getByLabel('Show', { exact: true }).selectOption('api');
  await waitFor('the chart to show rule api', async () => /rule api/.test(await page.locator('#chart-span').innerText()));
  await page.getByLabel('Show', { exact: true }).selectOption('');

  // Let traffic paint the chart, then take the pictures.
  // For the committed picture, wait for about half a minute of traffic.
  const want = Number(process.env.WEIR_CHART_POINTS || 8);
  await waitFor(`${want} seconds in the chart`, async () => (await attrs()).points >= want, 30000 + want * 1500, 500);
  await blocked.locator(`li[data-identity="${ATTACKER}"]`).waitFor({ state: 'visible', timeout: 20000 });
  if (shot) {
    mkdirSync(dirname(shot), { recursive: true });
    await page.evaluate(() => { document.activeElement?.blur(); window.scrollTo(0, 0); });
    await page.mouse.move(0, 0);
    await page.waitForTimeout(200);
    await page.screenshot({ path: shot });
    log('screenshot', shot);
  }
  if (shotDir) {
    mkdirSync(shotDir, { recursive: true });
    await page.screenshot({ path: join(shotDir, 'dashboard-full.png'), fullPage: true });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.waitForTimeout(300);
    await page.screenshot({ path: join(shotDir, 'dashboard-dark.png') });
    await page.emulateMedia({ colorScheme: 'light' });
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(400);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    if (overflow > 1) fail(`page scrolls sideways by ${overflow}px at 390px wide`);
    await page.screenshot({ path: join(shotDir, 'dashboard-390.png'), fullPage: true });
    if (process.env.WEIR_SHOT_CLIPS) {
      const height = await page.evaluate(() => document.documentElement.scrollHeight);
      for (let y = 0, i = 0; y < height; y += 800, i++) {
        await page.screenshot({ path: join(shotDir, `dashboard-390-${i}.png`), fullPage: true, clip: { x: 0, y, width: 390, height: Math.min(800, height - y) } });
      }
    }
    log('extra screenshots in', shotDir);
  }

  // The one 401 is the wrong token this test typed on purpose.
  const bad = problems.filter((p) => !/status of 401/.test(p));
  if (bad.length) fail(`browser reported problems:\n  ${bad.join('\n  ')}`);
  log(`ok (${sent} checks of background traffic; slowest check ${Math.round(slowest)} ms)`);
} finally {
  stopTraffic = true;
  await trafficDone;
  await browser.close();
}
