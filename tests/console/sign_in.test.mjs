// Signs a person in to the console in Debian's Chromium (SPEC 16), against a gateway on HTTPS and the real
// OpenID provider that tests/sign_in.rs started: the console's login redirect, the provider's login and
// consent pages, the callback, the console showing who is signed in with their teams and scopes, an
// approval granted with the session cookie and its CSRF token, and logout. Every change is confirmed
// through the API. Prints "sign-in: all checks passed" at the end.

import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/sign_in.rs sets it)`);
  return value;
};
const BASE = env('SIGNIN_BASE');
const ISSUER = env('SIGNIN_ISSUER');
const APPROVAL = env('SIGNIN_APPROVAL');
const SHOTS = env('SIGNIN_SCREENSHOTS');
const TOKEN = env('SIGNIN_TOKEN');

function step(name) { console.log(`sign-in: ${name}`); }

// Confirms through the API with an operator token (the gateway's certificate is the test's own).
async function api(route) {
  const response = await fetch(`${BASE}${route}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  return response.json();
}

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  // The test's CA is not the system's: the browser is told to accept the gateway's certificate.
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  const shot = (name) => page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });

  step('the console offers the identity provider');
  await page.goto(`${BASE}/console/`);
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  await page.getByTestId('provider-sign-in').click();

  step("the provider's login page, then its consent page");
  await page.waitForURL((url) => url.href.startsWith(ISSUER));
  await page.locator('input[name=login]').fill('ann');
  await page.locator('input[name=password]').fill('wrong');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#error').filter({ hasText: 'Wrong user or password' }).waitFor();
  await page.locator('input[name=login]').fill('ann');
  await page.locator('input[name=password]').fill('ann-pw');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Authorize' }).waitFor();
  await page.getByRole('button', { name: 'Continue' }).click();

  step('the callback signs in; the console shows who, with their teams and scopes');
  await page.waitForURL(`${BASE}/console/#/overview`);
  await page.getByTestId('signed-in-as').filter({ hasText: 'Signed in as Ann Admin (ann)' }).waitFor();
  assert.match(await page.getByTestId('signed-in-scopes').textContent(), /every team: seal\.admin/);
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
  const cookies = await context.cookies(BASE);
  const session = cookies.find((cookie) => cookie.name === '__Host-sealgate');
  assert.ok(session, `the session cookie: ${JSON.stringify(cookies.map((c) => c.name))}`);
  assert.equal(session.httpOnly, true);
  assert.equal(session.secure, true);
  assert.equal(session.sameSite, 'Strict');
  assert.equal(session.path, '/');
  assert.equal(await page.evaluate(() => document.cookie), '', 'scripts cannot read the cookie');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('sealgate.operator_token')), null, 'no token');
  await shot('console-signed-in');

  step('an approval granted with the session (the cookie and its CSRF token)');
  await page.goto(`${BASE}/console/#/approvals`);
  const card = page.locator(`article[data-approval="${APPROVAL}"]`);
  await card.waitFor();
  await shot('console-signed-in-approvals');
  await card.getByRole('button', { name: 'Grant' }).click();
  await card.waitFor({ state: 'detached' });
  const granted = await api(`/v1/approvals/${APPROVAL}`);
  assert.equal(granted.status, 'granted');
  assert.match(JSON.stringify(granted.decided_by), /ann/);

  step('logout ends the session: the console asks to sign in again, the cookie is worth nothing');
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  const status = await fetch(`${BASE}/console/session`, {
    headers: { cookie: `__Host-sealgate=${session.value}` },
  }).then((response) => response.status);
  assert.equal(status, 401);

  assert.deepEqual(problems, []);
  console.log('sign-in: all checks passed');
} finally {
  await browser.close();
}
