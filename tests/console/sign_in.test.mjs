// People sign in to the console in Debian's Chromium (SPEC 16) and approve a payment that needs two of
// them (SPEC 13 r4), against a gateway on HTTPS and the real OpenID provider that tests/console.rs
// started. Each person uses a browser of their own (their own cookies, at the gateway and at the
// provider). Both are bound to team payments, so the console shows them payments' requests and events
// only, and offers them only what their roles allow. Every change is confirmed through the API.
// Prints "sign-in: all checks passed" at the end.

import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/console.rs sets it)`);
  return value;
};
const BASE = env('SIGNIN_BASE');
const ISSUER = env('SIGNIN_ISSUER');
// Team payments' request, which needs two people; and team ops's, which neither person may see.
const APPROVAL = env('SIGNIN_APPROVAL');
const OTHER_TEAM_APPROVAL = env('SIGNIN_OTHER_TEAM_APPROVAL');
const SHOTS = env('SIGNIN_SCREENSHOTS');
const TOKEN = env('SIGNIN_TOKEN');

function step(name) { console.log(`sign-in: ${name}`); }

// Confirms through the API with an operator token (the gateway's certificate is the test's own).
async function api(route) {
  const response = await fetch(`${BASE}${route}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  return response.json();
}

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });

// A person's own browser: a page, the failed requests and script errors seen on it, and screenshots.
async function personalBrowser() {
  // The test's CA is not the system's: the browser is told to accept the gateway's certificate.
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  // Every refused request of the console to the gateway (a page asking for what the person may not
  // read is the fault this catches); the browser's own favicon request is not the console's.
  page.on('response', (response) => {
    const url = response.url();
    if (response.status() >= 400 && url.startsWith(BASE) && !url.endsWith('/favicon.ico')) problems.push(`${response.status()} ${url}`);
  });
  const shot = (name) => page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
  return { context, page, problems, shot };
}

// Runs `action`, which must make the gateway refuse `route` with `status`, and takes that one refusal out
// of the person's problems, so that any other stays to fail the test.
async function refusedOnPurpose({ page, problems }, status, route, action) {
  const url = `${BASE}${route}`;
  const refused = page.waitForResponse((response) => response.url() === url && response.status() === status);
  const result = await action();
  await refused;
  const index = problems.indexOf(`${status} ${url}`);
  assert.ok(index >= 0, `the refusal ${status} ${route} among ${JSON.stringify(problems)}`);
  problems.splice(index, 1);
  return result;
}

// From the console's sign-in page through the provider's login and consent pages back to the console.
async function signIn(page, login, password) {
  await page.goto(`${BASE}/console/`);
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  await page.getByTestId('provider-sign-in').click();
  await page.waitForURL((url) => url.href.startsWith(ISSUER));
  await page.locator('input[name=login]').fill(login);
  await page.locator('input[name=password]').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Authorize' }).waitFor();
  await page.getByRole('button', { name: 'Continue' }).click();
  await page.waitForURL(`${BASE}/console/#/overview`);
}

// Logout ends the session: the console asks to sign in again, and the cookie is worth nothing.
async function signOut({ page, context }) {
  const session = (await context.cookies(BASE)).find((cookie) => cookie.name === '__Host-sealgate');
  assert.ok(session, 'signed in before signing out');
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  await page.getByTestId('provider-sign-in').waitFor();
  const status = await fetch(`${BASE}/console/session`, {
    headers: { cookie: `__Host-sealgate=${session.value}` },
  }).then((response) => response.status);
  assert.equal(status, 401, 'the logged-out cookie is refused');
}

try {
  const pat = await personalBrowser();
  const { page } = pat;

  step("pat: the console offers the identity provider; a wrong password is refused on the provider's page");
  await page.goto(`${BASE}/console/`);
  await page.getByTestId('provider-sign-in').click();
  await page.waitForURL((url) => url.href.startsWith(ISSUER));
  await page.locator('input[name=login]').fill('pat');
  await page.locator('input[name=password]').fill('wrong');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#error').filter({ hasText: 'Wrong user or password' }).waitFor();
  pat.problems.length = 0; // the provider's 401 for the wrong password was the point of this step

  step("pat: login and consent at the provider; the console shows who, with pat's team and scopes");
  await signIn(page, 'pat', 'pat-pw');
  await page.getByTestId('signed-in-as').filter({ hasText: 'Signed in as Pat Payments (pat)' }).waitFor();
  assert.match(await page.getByTestId('signed-in-scopes').textContent(), /team payments: .*seal\.approval\.decide/);
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
  await page.getByText('they need seal.metrics.read on every team').waitFor();
  const cookies = await pat.context.cookies(BASE);
  const session = cookies.find((cookie) => cookie.name === '__Host-sealgate');
  assert.ok(session, `the session cookie: ${JSON.stringify(cookies.map((c) => c.name))}`);
  assert.equal(session.httpOnly, true);
  assert.equal(session.secure, true);
  assert.equal(session.sameSite, 'Strict');
  assert.equal(session.path, '/');
  assert.equal(await page.evaluate(() => document.cookie), '', 'scripts cannot read the cookie');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('sealgate.operator_token')), null, 'no token');

  step('pat: the navigation offers only the pages of his scopes');
  const nav = page.getByRole('navigation', { name: 'Console pages' });
  for (const [name, shown] of [['Approvals', true], ['Sessions', true], ['Security contexts', true], ['Audit', true], ['Claims', false]]) {
    assert.equal(await nav.getByRole('link', { name }).isVisible(), shown, `${name} in the navigation`);
  }
  await pat.shot('console-signed-in');

  step("pat: payments' request is listed with its team, ops's is not, and reading it directly is 404");
  await nav.getByRole('link', { name: 'Approvals' }).click();
  const card = page.locator(`article[data-approval="${APPROVAL}"]`);
  await card.waitFor();
  assert.equal(await card.getByTestId('team').textContent(), 'payments');
  assert.equal(await card.getByTestId('grants').textContent(), '0 of 2; not the session\'s registrant');
  assert.equal(await page.locator('article[data-approval]').count(), 1, "only payments' request is listed");
  assert.equal(await page.locator(`article[data-approval="${OTHER_TEAM_APPROVAL}"]`).count(), 0);
  const otherTeam = await refusedOnPurpose(pat, 404, `/v1/approvals/${OTHER_TEAM_APPROVAL}`,
    () => page.evaluate(async (id) => (await fetch(`/v1/approvals/${id}`)).status, OTHER_TEAM_APPROVAL));
  assert.equal(otherTeam, 404, "another team's request is not found, as one that does not exist");

  step('pat grants: the request stays pending, with one grant, by pat, vouched for by the provider');
  await card.getByLabel(/Reason/).fill('invoice 42 checked');
  await card.getByRole('button', { name: 'Grant' }).click();
  await card.getByTestId('grants').filter({ hasText: /^1 of 2: Pat Payments <pat> \(oidc\)/ }).waitFor();
  await page.getByRole('status').filter({ hasText: 'has 1 of 2 and waits for more' }).waitFor();
  const first = await api(`/v1/approvals/${APPROVAL}`);
  assert.equal(first.status, 'pending', JSON.stringify(first));
  assert.equal(first.grants.length, 1);
  assert.deepEqual(first.grants[0].by, { iss: ISSUER, sub: 'pat', name: 'Pat Payments', via: 'oidc' });
  assert.equal(first.grants[0].reason, 'invoice 42 checked');
  await pat.shot('console-signed-in-approvals-one-grant');

  step('pat grants again: the page shows the refusal (409, 6004), and nothing changes');
  await refusedOnPurpose(pat, 409, `/v1/approvals/${APPROVAL}/grant`,
    () => card.getByRole('button', { name: 'Grant' }).click());
  await card.getByRole('alert').filter({ hasText: /HTTP 409, 6004 CONFLICT: you already granted approval request/ }).waitFor();
  assert.deepEqual((await api(`/v1/approvals/${APPROVAL}`)).grants, first.grants, 'the second grant by pat is not counted');

  step("pat: the audit page reads payments' events through the query, without the export");
  await nav.getByRole('link', { name: 'Audit' }).click();
  await page.getByTestId('chain-status').filter({ hasText: 'The events of team payments.' }).waitFor();
  const events = page.getByTestId('events');
  await events.locator('tbody tr').first().waitFor();
  const teams = await events.locator('tbody tr td:nth-child(8)').allTextContents();
  assert.ok(teams.length > 0 && teams.every((team) => team === 'payments'), `teams of the events: ${teams.join(', ')}`);
  const types = await events.locator('tbody tr td:nth-child(3)').allTextContents();
  for (const expected of ['ApprovalRequested', 'ApprovalGranted', 'SessionCreated']) {
    assert.ok(types.includes(expected), `${expected} in ${types.join(', ')}`);
  }
  assert.equal(await page.getByRole('button', { name: 'Download export' }).count(), 0, 'no export is offered');

  step('pat: sessions and contexts show their team, and offer no change that needs a scope pat lacks');
  await nav.getByRole('link', { name: 'Sessions' }).click();
  const row = page.locator('tr[data-session="pay"]');
  await row.waitFor();
  assert.match(await row.textContent(), /payments/);
  assert.equal(await row.getByRole('button', { name: 'Revoke' }).count(), 0, 'no Revoke without seal.session.revoke');
  assert.equal(await page.locator('tr[data-session="ops-run"]').count(), 0, "ops's session is not listed");
  await nav.getByRole('link', { name: 'Security contexts' }).click();
  const context = page.locator('tr[data-context="console-pay"]');
  await context.waitFor();
  assert.match(await context.textContent(), /payments/);
  assert.equal(await page.locator('tr[data-context="console-ops"]').count(), 0, "ops's context is not listed");
  assert.equal(await page.getByRole('button', { name: 'Draft it' }).count(), 0, 'no new context without seal.context.write');
  await context.getByRole('button', { name: 'console-pay' }).click();
  await page.getByText('changing it needs seal.context.write on team payments').waitFor();
  assert.equal(await page.getByLabel('Draft').count(), 0, 'no editor without seal.context.write');
  assert.deepEqual(pat.problems, [], 'no request of the console was refused, and no script failed');

  step('pat signs out');
  await signOut(pat);

  step('quinn, in another browser, signs in and grants: two people granted, the request is granted');
  const quinn = await personalBrowser();
  await signIn(quinn.page, 'quinn', 'quinn-pw');
  await quinn.page.getByTestId('signed-in-as').filter({ hasText: 'Signed in as Quinn Lead (quinn)' }).waitFor();
  const quinnNav = quinn.page.getByRole('navigation', { name: 'Console pages' });
  assert.equal(await quinnNav.getByRole('link', { name: 'Audit' }).isVisible(), false, 'quinn may read no audit event');
  await quinnNav.getByRole('link', { name: 'Approvals' }).click();
  const quinnCard = quinn.page.locator(`article[data-approval="${APPROVAL}"]`);
  await quinnCard.getByTestId('grants').filter({ hasText: /^1 of 2: Pat Payments <pat> \(oidc\)/ }).waitFor();
  await quinnCard.getByRole('button', { name: 'Grant' }).click();
  await quinnCard.waitFor({ state: 'detached' });
  const granted = await api(`/v1/approvals/${APPROVAL}`);
  assert.equal(granted.status, 'granted', JSON.stringify(granted));
  assert.deepEqual(granted.grants.map((grant) => grant.by.sub), ['pat', 'quinn']);
  assert.equal(granted.decided_by.sub, 'quinn');
  assert.equal(granted.decided_by.via, 'oidc');
  await quinn.page.getByLabel('Show').selectOption('granted');
  const decided = quinn.page.locator(`article[data-approval="${APPROVAL}"]`);
  await decided.getByTestId('grants').filter({ hasText: /^2 of 2: Pat Payments <pat> \(oidc\), Quinn Lead <quinn> \(oidc\)/ }).waitFor();
  await decided.getByTestId('decided-by').filter({ hasText: /^Quinn Lead <quinn> \(oidc\) at / }).waitFor();
  await quinn.shot('console-signed-in-approvals');
  assert.deepEqual(quinn.problems, []);

  step('quinn signs out');
  await signOut(quinn);

  console.log('sign-in: all checks passed');
} finally {
  await browser.close();
}
