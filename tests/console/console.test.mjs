// Drives the operator console in Debian's Chromium against a real gateway that tests/console.rs started
// and filled through the API. Every step that changes something is confirmed through the API itself.
// Exits non-zero with the failed check's message; prints "console: all checks passed" at the end.

import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/console.rs sets it)`);
  return value;
};
const BASE = env('CONSOLE_BASE');
const TOKEN = env('CONSOLE_TOKEN');
const REVOKE = env('CONSOLE_REVOKE_SESSION');
const KEEP = env('CONSOLE_KEEP_SESSION');
const CONTEXT = env('CONSOLE_CONTEXT');
const CLAIM = env('CONSOLE_CLAIM');
const PENDING = env('CONSOLE_PENDING_CLAIM');
const SHOTS = env('CONSOLE_SCREENSHOTS');
const OTHER_TOKEN = env('CONSOLE_OTHER_TOKEN');

async function api(method, route, body) {
  const response = await fetch(`${BASE}${route}`, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: response.status, body: await response.json().catch(() => null) };
}

function step(name) { console.log(`console: ${name}`); }

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const problems = [];
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push({ text: message.text(), url: message.location().url });
  });
  page.on('pageerror', (error) => problems.push({ text: `page error: ${error.message}`, url: '' }));
  const shot = (name) => page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });

  step('the page is served with its security headers');
  const first = await page.goto(`${BASE}/console/`);
  const headers = first.headers();
  assert.match(headers['content-security-policy'] ?? '', /default-src 'self'/);
  assert.match(headers['content-security-policy'], /frame-ancestors 'none'/);
  assert.equal(headers['x-content-type-options'], 'nosniff');
  assert.equal(headers['referrer-policy'], 'no-referrer');

  step('a refused token is named as refused, and a good one signs in');
  const tokenField = page.getByLabel(/Operator token/);
  await tokenField.fill('not.a.token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').filter({ hasText: 'Token refused' }).waitFor();
  problems.length = 0; // the refused token's 401, logged by Chromium, was the point of this step
  await tokenField.fill(TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
  assert.equal(await page.evaluate(() => document.cookie), '', 'no cookie holds the token');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('sealgate.operator_token')), TOKEN);

  step('keyboard: Tab reaches the navigation');
  await page.evaluate(() => document.activeElement?.blur());
  const reached = [];
  for (let i = 0; i < 12 && !reached.includes('Sessions'); i += 1) {
    await page.keyboard.press('Tab');
    reached.push(await page.evaluate(() => document.activeElement?.textContent?.trim()));
  }
  assert.ok(reached.includes('Skip to content') && reached.includes('Sessions'), `Tab order: ${reached.join(' | ')}`);
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: 'Sessions' }).waitFor();
  assert.equal(await page.evaluate(() => document.activeElement?.id), 'main', 'the chosen page takes the focus');

  step('overview: counts from /metrics and charts');
  await page.goto(`${BASE}/console/#/overview`);
  await page.getByTestId('calls-total').waitFor();
  assert.ok(Number(await page.getByTestId('calls-total').textContent()) >= 2, 'the two API calls are counted');
  assert.equal(await page.locator('figure svg').count(), 3);
  const ghost = page.locator('tr[data-upstream="ghost"]');
  await ghost.waitFor();
  assert.match(await ghost.textContent(), /down.*failed to start/, 'an MCP upstream that cannot start is shown');
  assert.equal(await ghost.getAttribute('class'), 'bad');
  await shot('overview');

  step('sessions: listed with context, agent and calls; revoke through the keyboard-reachable button');
  await page.goto(`${BASE}/console/#/sessions`);
  const row = page.locator(`tr[data-session="${REVOKE}"]`);
  await row.waitFor();
  assert.match(await row.textContent(), /test/);
  assert.match(await row.textContent(), /agent-1/);
  assert.equal(await row.locator('td:nth-child(4)').textContent(), 'default', "the session's team");
  assert.match(await page.locator(`tr[data-session="${KEEP}"]`).textContent(), /2 \/ ∞/, "two calls were allowed: the write and the slow one");
  await shot('sessions');
  // The row's Revoke button is reached by Tab alone, from the top of the page, and works with Enter.
  await page.evaluate(() => document.activeElement?.blur());
  let onRevoke = false;
  for (let i = 0; i < 20 && !onRevoke; i += 1) {
    await page.keyboard.press('Tab');
    onRevoke = await page.evaluate((id) => document.activeElement?.textContent === 'Revoke'
      && document.activeElement.closest('tr')?.dataset.session === id, REVOKE);
  }
  assert.ok(onRevoke, 'Tab reaches the Revoke button of the session');
  await page.keyboard.press('Enter');
  await row.getByRole('button', { name: 'Yes, revoke' }).click();
  await row.waitFor({ state: 'detached' });
  const revoked = await api('GET', `/v1/seal/sessions/${REVOKE}`);
  assert.equal(revoked.body.status, 'revoked', JSON.stringify(revoked.body));

  step('claims: the committed call is in the history; the PENDING one is resolved with evidence');
  await page.goto(`${BASE}/console/#/claims`);
  await page.getByText(CLAIM).waitFor();
  const pendingRow = page.locator(`tr[data-claim="${PENDING}"]`);
  assert.match(await pendingRow.textContent(), /slow\.op.*agent-1.*\d+ s/);
  await shot('claims');
  await pendingRow.getByRole('button', { name: 'Resolve…' }).click();
  await pendingRow.getByLabel('Outcome').selectOption('committed');
  await pendingRow.getByLabel(/^Result/).fill('{"jsonrpc": "2.0", "id": null, "result": {"done": true}}');
  await pendingRow.getByLabel('Evidence').fill('the tool log shows it ran');
  await pendingRow.getByRole('button', { name: 'Resolve claim' }).click();
  await page.getByText('No PENDING claims.').waitFor();
  const resolved = (await api('GET', `/v1/claims/${encodeURIComponent(PENDING)}`)).body;
  assert.equal(resolved.status, 'COMMITTED', JSON.stringify(resolved));
  assert.deepEqual(resolved.result.result, { done: true });

  step('contexts: a schema error is shown and nothing is saved');
  const before = (await api('GET', `/v1/security-contexts/${CONTEXT}`)).body;
  await page.goto(`${BASE}/console/#/contexts`);
  await page.getByRole('button', { name: CONTEXT }).click();
  await page.getByTestId('context-yaml').filter({ hasText: 'tool_pattern: shop.*' }).waitFor();
  const draft = page.getByLabel('Draft');
  const bad = { name: CONTEXT, capabilities: [{ tool_pattern: 'shop.*', claim: 'sometimes' }] };
  await draft.fill(JSON.stringify(bad, null, 2));
  await page.locator('#draft-errors li').filter({ hasText: 'capabilities[0].claim' }).waitFor();
  await page.getByRole('button', { name: 'Review changes' }).click();
  await page.getByText('Fix the errors above first; nothing was saved.').waitFor();
  const unchanged = (await api('GET', `/v1/security-contexts/${CONTEXT}`)).body;
  assert.equal(unchanged.version, before.version, 'the refused draft changed nothing');

  step('contexts: a valid edit shows its diff, saves, and the dry run shows the new decision');
  const good = { name: CONTEXT, deny_list: ['shop.refund'], capabilities: [{ tool_pattern: 'shop.*', claim: 'off' }] };
  await draft.fill(JSON.stringify(good, null, 2));
  assert.equal(await page.locator('#draft-errors li').count(), 0);
  // Before the save, "try a call" decides by the draft, and nothing is saved by it.
  await page.getByLabel('Tool').fill('shop.refund');
  await page.getByRole('button', { name: 'Try' }).click();
  await page.getByTestId('decision').filter({ hasText: 'deny 2001' }).filter({ hasText: 'the draft (not saved)' }).waitFor();
  assert.equal((await api('GET', `/v1/security-contexts/${CONTEXT}`)).body.version, before.version, 'the dry run saved nothing');
  await page.getByRole('button', { name: 'Review changes' }).click();
  await page.getByTestId('diff').locator('.add').filter({ hasText: 'deny_list' }).waitFor();
  await page.getByRole('button', { name: 'Save', exact: true }).click();
  await page.getByText(`Context ${CONTEXT} saved`).waitFor();
  const after = (await api('GET', `/v1/security-contexts/${CONTEXT}`)).body;
  assert.deepEqual(after.deny_list, ['shop.refund']);
  assert.notEqual(after.version, before.version);
  await page.getByLabel('Tool').fill('shop.refund');
  await page.getByRole('button', { name: 'Try' }).click();
  await page.getByTestId('decision').filter({ hasText: 'deny 2001' }).waitFor();
  await page.getByLabel('Tool').fill('shop.buy');
  await page.getByRole('button', { name: 'Try' }).click();
  await page.getByTestId('decision').filter({ hasText: /Decisionallow/ }).waitFor();
  await shot('contexts');

  step('contexts: a shadow version shows what promoting it changes and where its decisions differed');
  await page.getByRole('button', { name: 'test', exact: true }).click();
  await page.getByTestId('shadow-summary').filter({ hasText: '3 calls decided' }).filter({ hasText: '1 differently' }).waitFor();
  const difference = await page.getByTestId('shadow-difference').allInnerTexts();
  assert.deepEqual(difference.map((row) => row.split('\t')), [['tool.write', 'allow', '2001', '1']]);
  await page.getByTestId('shadow-diff').locator('.add').filter({ hasText: 'tool.write' }).waitFor();

  {
    step('approvals: both pending requests are queued with their arguments and time left');
    await page.goto(`${BASE}/console/#/approvals`);
    const cards = page.locator('article[data-approval]');
    await cards.filter({ hasText: 'grant-me' }).waitFor();
    await cards.filter({ hasText: 'deny-me' }).waitFor();
    const grantCard = cards.filter({ hasText: 'grant-me' });
    assert.match(await grantCard.locator('pre').textContent(), /"amount": 12/);
    assert.match(await grantCard.getByTestId('time-left').textContent(), /min/);
    await shot('approvals');
    const grantId = await grantCard.getAttribute('data-approval');
    await grantCard.getByRole('button', { name: 'Grant' }).click();
    await grantCard.waitFor({ state: 'detached' });
    assert.equal((await api('GET', `/v1/approvals/${grantId}`)).body.status, 'granted');
    const denyCard = cards.filter({ hasText: 'deny-me' });
    const denyId = await denyCard.getAttribute('data-approval');
    await denyCard.getByRole('button', { name: 'Deny' }).click();
    await denyCard.getByText('A reason is required to deny.').waitFor();
    assert.equal((await api('GET', `/v1/approvals/${denyId}`)).body.status, 'pending');
    await denyCard.getByLabel(/Reason/).fill('not this payee');
    await denyCard.getByRole('button', { name: 'Deny' }).click();
    await denyCard.waitFor({ state: 'detached' });
    const denied = (await api('GET', `/v1/approvals/${denyId}`)).body;
    assert.equal(denied.status, 'denied');
    assert.equal(denied.reason, 'not this payee');
  }

  step('audit: events newest first, filter by type, the chain verified in the browser');
  await page.goto(`${BASE}/console/#/audit`);
  await page.getByTestId('chain-status').filter({ hasText: 'Chain intact' }).waitFor();
  const events = page.getByTestId('events');
  const types = () => events.locator('tbody tr td:nth-child(3)').allTextContents();
  await events.locator('tbody tr').first().waitFor();
  const all = await types();
  for (const expected of ['SessionCreated', 'SessionRevoked', 'SecurityContextChanged', 'PolicyViolationBlocked']) {
    assert.ok(all.includes(expected), `${expected} in ${all.join(', ')}`);
  }
  const seqs = (await events.locator('tbody tr td:nth-child(1)').allTextContents()).map(Number);
  assert.deepEqual(seqs, [...seqs].sort((a, b) => b - a), 'newest first');
  await shot('audit');

  step('audit: signed checkpoints are listed and verified in the browser (WebCrypto Ed25519); a tampered one is flagged');
  await page.getByTestId('chain-status').filter({ hasText: /[1-9]\d* signed checkpoints verified/ }).waitFor();
  const statuses = page.getByTestId('checkpoint-status');
  await statuses.first().waitFor();
  const listed = await statuses.allTextContents();
  assert.ok(listed.length >= 1 && listed.every((s) => s === 'signature verified'), listed.join(' | '));
  await page.route('**/v1/audit/checkpoints*', async (route) => {
    const original = await route.fetch();
    const body = await original.json();
    const sig = body.items[0].checkpoint.sig;
    body.items[0].checkpoint.sig = `${sig[0] === 'A' ? 'B' : 'A'}${sig.slice(1)}`; // one character of the newest changed
    await route.fulfill({ response: original, json: body });
  });
  await page.getByRole('button', { name: 'Verify again' }).click();
  await statuses.first().filter({ hasText: 'NOT verified: the signature does not verify' }).waitFor();
  assert.ok((await statuses.allTextContents()).slice(1).every((s) => s === 'signature verified'), 'only the tampered one is flagged');
  await page.unroute('**/v1/audit/checkpoints*');

  step('audit: the export downloads, and a tampered export is reported as broken');
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Download export' }).click()]);
  const exported = (await readFile(await download.path(), 'utf8')).trim().split('\n').map((line) => JSON.parse(line));
  assert.ok(exported.length >= Math.max(...seqs), 'every event up to the newest is in the export');
  assert.equal(exported.at(-1).type, 'AuditCheckpoint', 'the export ends with a checkpoint signed when it was taken');
  assert.deepEqual(exported.map((e) => e.seq), exported.map((_, i) => i + 1));
  await page.route('**/v1/audit/export', async (route) => {
    const original = await route.fetch();
    const lines = (await original.text()).trim().split('\n');
    const altered = JSON.parse(lines[2]);
    altered.tool = 'tool.other'; // one field of seq 3 changed after sealing
    lines[2] = JSON.stringify(altered);
    await route.fulfill({ response: original, body: `${lines.join('\n')}\n` });
  });
  await page.getByRole('button', { name: 'Verify again' }).click();
  await page.getByTestId('chain-status').filter({ hasText: 'Chain NOT verified at seq 3: hash does not match' }).waitFor();
  await page.unroute('**/v1/audit/export');
  await page.getByLabel('Type').selectOption('SessionRevoked');
  await page.getByRole('button', { name: 'Filter' }).click();
  await page.waitForFunction(() => [...document.querySelectorAll('[data-testid="events"] tbody tr td:nth-child(3)')].every((td) => td.textContent === 'SessionRevoked'));
  assert.deepEqual(await types(), ['SessionRevoked']);

  step('a #token= link asks before it replaces the signed-in token, and leaves the address bar at once');
  const stored = () => page.evaluate(() => sessionStorage.getItem('sealgate.operator_token'));
  for (const [choice, expected] of [['Keep my current token', TOKEN], ['Use the link’s token', OTHER_TOKEN]]) {
    await page.goto(`${BASE}/console/#token=${encodeURIComponent(OTHER_TOKEN)}`);
    await page.getByRole('heading', { name: 'Replace your token?' }).waitFor();
    assert.ok(!page.url().includes('token='), `the token left the address bar: ${page.url()}`);
    assert.equal(await stored(), TOKEN, 'nothing is replaced before the operator answers');
    await page.getByRole('button', { name: choice }).click();
    await page.getByRole('heading', { name: 'Overview' }).waitFor();
    assert.equal(await stored(), expected, choice);
  }
  // The same token again is no question.
  await page.goto(`${BASE}/console/#token=${encodeURIComponent(OTHER_TOKEN)}`);
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
  assert.equal(await stored(), OTHER_TOKEN);

  step("a token is offered only the pages and actions of its scopes (its own scope claim)");
  const nav = page.getByRole('navigation', { name: 'Console pages' });
  assert.equal(await nav.getByRole('link', { name: 'Sessions' }).isVisible(), true);
  assert.equal(await nav.getByRole('link', { name: 'Approvals' }).isVisible(), false, 'no Approvals without seal.approval.read');
  await nav.getByRole('link', { name: 'Sessions' }).click();
  const kept = page.locator(`tr[data-session="${KEEP}"]`);
  await kept.waitFor();
  assert.equal(await kept.getByRole('button', { name: 'Revoke' }).count(), 0, 'no Revoke without seal.session.revoke');

  step('no errors in the browser console');
  assert.deepEqual(problems.map((p) => `${p.text} (${p.url})`), []);
  console.log('console: all checks passed');
} finally {
  await browser.close();
}
