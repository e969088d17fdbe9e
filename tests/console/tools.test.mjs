// Drives the console's Tools page (SPEC 18) in Debian's Chromium against a real gateway that tests/console.rs
// started, whose MCP upstream `ch` changed the description of `ch.read` after it was pinned. The page must
// show the changed definition beside the pinned one with the differing lines marked and the hidden
// characters made visible, and its Accept button must pin it (confirmed through the API).
// Exits non-zero with the failed check's message; prints "console tools: all checks passed" at the end.

import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/console.rs sets it)`);
  return value;
};
const BASE = env('CONSOLE_BASE');
const TOKEN = env('CONSOLE_TOKEN');
const SHOTS = env('CONSOLE_SCREENSHOTS');

async function tools() {
  const response = await fetch(`${BASE}/v1/tools`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  assert.equal(response.status, 200);
  return (await response.json()).items;
}

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const problems = [];
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  await page.goto(`${BASE}/console/`);
  await page.getByLabel(/Operator token/).fill(TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Overview' }).waitFor();

  console.log('console tools: the page lists every tool with its status');
  await page.getByRole('link', { name: 'Tools' }).click();
  await page.getByRole('heading', { name: 'Tools' }).waitFor();
  const rows = page.getByTestId('tool-row');
  await rows.first().waitFor();
  const text = await rows.allInnerTexts();
  assert.ok(text.some((row) => row.includes('ch.read') && row.includes('changed') && row.includes('withheld: hidden_characters')), text.join('\n'));
  assert.ok(text.some((row) => row.includes('ch.write') && row.includes('pinned') && row.includes('listed')), text.join('\n'));

  console.log('console tools: the changed definition beside the pinned one, differences marked');
  const card = page.getByTestId('withheld-tool');
  await card.waitFor();
  const pinned = card.getByTestId('pinned-definition');
  const seen = card.getByTestId('seen-definition');
  assert.match(await pinned.locator('.del').innerText(), /"description": "Reads a file\."/);
  const added = await seen.locator('.add').innerText();
  assert.match(added, /"description": "Reads a file\.\\u\{E0073\}/, 'tag characters are shown as escapes');
  assert.equal(await seen.locator('.del').count(), 0);
  assert.ok((await seen.innerText()).includes('"name": "read"'), 'unchanged lines are shown too');
  await page.screenshot({ path: path.join(SHOTS, 'tools.png'), fullPage: true });

  console.log('console tools: Accept pins the definition seen');
  const before = (await tools()).find((tool) => tool.tool === 'ch.read');
  await card.getByRole('button', { name: 'Accept the definition seen' }).click();
  await page.getByTestId('withheld-tool').waitFor({ state: 'detached' });
  const after = (await tools()).find((tool) => tool.tool === 'ch.read');
  assert.equal(after.status, 'pinned');
  assert.equal(after.pinned.definition_sha256, before.seen.definition_sha256);

  assert.deepEqual(problems, []);
  console.log('console tools: all checks passed');
} finally {
  await browser.close();
}
