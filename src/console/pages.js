// The console's pages. Each renders into `main` and returns a function that stops its timers.

import {
  api, ApiFailure, apiText, barChart, diffLines, el, errorText, field, formatNumber, lineChart, may, mayEverywhere,
  parseMetrics, query, quantile, replace, say, signingKeys, span, teamsWith, toYaml, validate, verifyCheckpoint,
  verifyExport,
} from './lib.js';

const POLL_MS = 3000;

// The read scope of each page, so that the navigation offers only the pages the caller may read.
export const readScopes = {
  approvals: 'seal.approval.read', claims: 'seal.claim.read', sessions: 'seal.session.read',
  contexts: 'seal.context.read', audit: 'seal.audit.read', tools: 'seal.tool.read',
};

// "team payments, team ops", or "every team", for messages about what the caller holds.
function teamNames(scope) {
  const teams = teamsWith(scope) || ['*'];
  return teams.includes('*') ? 'every team' : teams.map((team) => `team ${team}`).join(', ');
}

// Why an action is not offered: the scope it needs on the object's team.
function notAllowed(scope, team) {
  return el('p', { class: 'muted', 'data-testid': 'not-allowed' }, `You may not change this: it needs ${scope} on team ${team}.`);
}

function ageOf(rfc3339) {
  return span(Date.now() - Date.parse(rfc3339));
}

function table(headers, rows, caption) {
  return el('table', {},
    el('caption', { class: 'muted' }, caption),
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows));
}

function problem(error) {
  return el('p', { class: 'bad', role: 'alert' }, errorText(error));
}

// Runs `tick` now and every `ms`; answers the stop function.
function every(ms, tick) {
  tick();
  const timer = setInterval(tick, ms);
  return () => clearInterval(timer);
}

// ---------------- Overview ----------------

// Samples survive page changes, so the charts show the minutes since sign-in, not since the last visit.
const history = [];
const HISTORY_MS = 10 * 60 * 1000;

function summarise(samples) {
  const sum = (name, filter = () => true) => samples.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
  const buckets = new Map();
  for (const s of samples.filter((x) => x.name === 'sealgate_request_duration_seconds_bucket')) {
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  const refusals = {};
  for (const s of samples.filter((x) => x.name === 'sealgate_decisions_total' && x.labels.decision === 'deny')) {
    refusals[s.labels.code] = (refusals[s.labels.code] || 0) + s.value;
  }
  return {
    t: Date.now(),
    calls: sum('sealgate_request_duration_seconds_count'),
    buckets,
    refusals,
    sessions: sum('sealgate_sessions_live'),
    pendingClaims: sum('sealgate_claims_pending'),
    inFlight: sum('sealgate_calls_in_flight'),
  };
}

// Each MCP upstream's server as /readyz?verbose reports it (SPEC 20 r11): one that is down is shown in red.
async function upstreamStates() {
  try {
    return (await api('GET', '/readyz?verbose')).upstreams || [];
  } catch {
    return []; // not ready (the store, no context): the other pages say why
  }
}

function upstreamTable(upstreams) {
  if (!upstreams.length) return el('p', { class: 'muted' }, 'No MCP upstreams are configured.');
  const rows = upstreams.map((u) => el('tr', { 'data-upstream': u.name, class: u.state === 'down' ? 'bad' : '' },
    el('td', {}, u.name), el('td', {}, u.state.replace('_', ' ')), el('td', {}, u.error || '')));
  return table(['Upstream', 'State', 'Why'], rows, 'MCP upstreams: a server starts on its first call; the log has the details of a failure.');
}

function overview(main) {
  const body = el('div');
  replace(main, el('h1', {}, 'Overview'), el('p', { class: 'muted' }, 'From the gateway\'s /metrics, sampled every 3 s while the console is open.'), body);
  return every(POLL_MS, async () => {
    const upstreams = upstreamTable(await upstreamStates());
    // The counts are the whole gateway's, every team's calls together: a team-bound person is not asked
    // for a 403.
    if (!mayEverywhere('seal.metrics.read')) {
      replace(body, el('p', { class: 'muted', role: 'status' }, 'The gateway\'s counts are of every team\'s calls: they need seal.metrics.read on every team.'), upstreams);
      return;
    }
    try {
      // Sent with the token: /metrics needs seal.metrics.read on this listener (SPEC 11 r3).
      const text = await api('GET', '/metrics');
      const sample = summarise(parseMetrics(typeof text === 'string' ? text : ''));
      // A revisit within a second would make a rate out of a few milliseconds: replace the last sample.
      if (history.length && sample.t - history[history.length - 1].t < 1000) history.pop();
      history.push(sample);
      while (history.length && history[0].t < Date.now() - HISTORY_MS) history.shift();
    } catch (error) {
      const elsewhere = error instanceof ApiFailure && error.status === 404;
      replace(body, elsewhere
        ? el('p', { class: 'muted', role: 'status' }, 'This gateway serves /metrics on a listener of its own (metrics.listen), not to the console.')
        : problem(error), upstreams);
      return;
    }
    const rates = [];
    const p99s = [];
    for (let i = 1; i < history.length; i += 1) {
      const [a, b] = [history[i - 1], history[i]];
      const seconds = (b.t - a.t) / 1000;
      rates.push({ t: b.t, v: Math.max(b.calls - a.calls, 0) / seconds });
      // p99 of the calls within the interval: the difference of the cumulative buckets.
      const delta = [...b.buckets].map(([le, count]) => ({ le, count: count - (a.buckets.get(le) || 0) }));
      const p = quantile(delta, 0.99);
      if (p !== null) p99s.push({ t: b.t, v: p * 1000 });
    }
    const last = history[history.length - 1];
    const overall = quantile([...last.buckets].map(([le, count]) => ({ le, count })), 0.99);
    const refusals = Object.entries(last.refusals).sort(([a], [b]) => a.localeCompare(b)).map(([label, v]) => ({ label, v }));
    replace(body,
      el('dl', { class: 'facts' },
        el('dt', {}, 'Calls answered'), el('dd', { 'data-testid': 'calls-total' }, formatNumber(last.calls)),
        el('dt', {}, 'Calls in flight'), el('dd', {}, formatNumber(last.inFlight)),
        el('dt', {}, 'Live sessions'), el('dd', {}, formatNumber(last.sessions)),
        el('dt', {}, 'PENDING claims'), el('dd', {}, formatNumber(last.pendingClaims)),
        el('dt', {}, 'p99 latency since start'), el('dd', {}, overall === null ? '–' : `${formatNumber(overall * 1000)} ms`)),
      el('div', { class: 'charts' },
        el('figure', { class: 'chart' }, el('figcaption', {}, 'Calls per second'), lineChart('Calls per second over time', rates, 'calls/s')),
        el('figure', { class: 'chart' }, el('figcaption', {}, 'Refusals by code (since start)'), barChart('Refusals by code', refusals)),
        el('figure', { class: 'chart' }, el('figcaption', {}, 'p99 latency per interval (ms)'), lineChart('p99 latency over time', p99s, 'ms'))),
      upstreams);
  });
}

// ---------------- Approvals (SPEC 13) ----------------

function approvals(main) {
  const statusSelect = el('select', {}, ['pending', 'granted', 'denied', 'expired', 'used'].map((s) => el('option', { value: s }, s)));
  const list = el('div', { 'aria-live': 'polite' });
  const cards = new Map();
  const refresh = async () => {
    let page;
    try {
      page = await api('GET', `/v1/approvals${query({ status: statusSelect.value, limit: 100 })}`);
    } catch (error) {
      cards.clear();
      replace(list, problem(error));
      return;
    }
    const seen = new Set(page.items.map((a) => a.approval_id));
    for (const [id, card] of cards) if (!seen.has(id)) { card.node.remove(); cards.delete(id); }
    if (page.items.length === 0 && cards.size === 0) replace(list, el('p', { class: 'muted', 'data-testid': 'approvals-empty' }, `No ${statusSelect.value} approval requests.`));
    else list.querySelector('[data-testid="approvals-empty"]')?.remove();
    for (const approval of page.items) {
      // Cards are kept across polls so that a reason being typed is not wiped by a refresh.
      if (!cards.has(approval.approval_id)) {
        const card = approvalCard(approval, refresh);
        cards.set(approval.approval_id, card);
        list.append(card.node);
      }
      cards.get(approval.approval_id).update(approval);
    }
  };
  statusSelect.addEventListener('change', () => { cards.clear(); list.replaceChildren(); refresh(); });
  replace(main, el('h1', {}, 'Approvals'),
    el('div', { class: 'filters' }, el('div', {}, ...field('Show', statusSelect))), list);
  const stopPolling = every(POLL_MS, refresh);
  const clock = setInterval(() => cards.forEach((card) => card.tick()), 1000);
  return () => { stopPolling(); clearInterval(clock); };
}

// Who did it (SPEC 16): the name beside the `sub`, and how the gateway knew them (oidc, jwks or key).
function person(identity) {
  const who = identity.name ? `${identity.name} <${identity.sub}>` : identity.sub;
  return `${who} (${identity.via})`;
}

// `1 of 2: Ann <ann> (oidc)`: the grants so far of those a request needs (SPEC 13 r4).
function grantsText(approval) {
  const by = approval.grants.map((grant) => person(grant.by)).join(', ');
  const needed = `${approval.grants.length} of ${approval.approvers}`;
  const separate = approval.separate_from_registrant ? '; not the session\'s registrant' : '';
  return by ? `${needed}: ${by}${separate}` : `${needed}${separate}`;
}

function approvalCard(approval, refresh) {
  const left = el('dd', { 'data-testid': 'time-left' });
  // Several approvers: the grants so far, refreshed by each poll while the request waits for more.
  const grants = approval.approvers > 1 || approval.grants.length > 0 ? el('dd', { 'data-testid': 'grants' }) : null;
  const reason = el('input', { type: 'text', size: 50 });
  const outcome = el('p', { role: 'alert' });
  const decide = (verb) => async () => {
    const text = reason.value.trim();
    if (verb === 'deny' && !text) { outcome.className = 'bad'; outcome.textContent = 'A reason is required to deny.'; reason.focus(); return; }
    try {
      const updated = await api('POST', `/v1/approvals/${encodeURIComponent(approval.approval_id)}/${verb}`, text ? { reason: text } : {});
      say(updated.status === 'pending'
        ? `Grant recorded: approval ${approval.approval_id} has ${updated.grants.length} of ${updated.approvers} and waits for more.`
        : `Approval ${approval.approval_id} ${updated.status}.`);
      await refresh();
    } catch (error) {
      outcome.className = 'bad';
      outcome.textContent = errorText(error);
    }
  };
  const pending = approval.status === 'pending';
  const actions = may('seal.approval.decide', approval.team)
    ? el('div', {},
      ...field('Reason (required to deny)', reason),
      el('div', { class: 'actions' },
        el('button', { type: 'button', on: { click: decide('grant') } }, 'Grant'),
        el('button', { type: 'button', class: 'danger', on: { click: decide('deny') } }, 'Deny')))
    : notAllowed('seal.approval.decide', approval.team);
  const node = el('article', { class: 'card', 'data-approval': approval.approval_id },
    el('h2', {}, approval.tool),
    el('dl', { class: 'facts' },
      el('dt', {}, 'Team'), el('dd', { 'data-testid': 'team' }, approval.team),
      el('dt', {}, 'Agent'), el('dd', {}, approval.sub),
      el('dt', {}, 'Session'), el('dd', {}, approval.session_id),
      el('dt', {}, 'Context'), el('dd', {}, `${approval.context} (${String(approval.context_version).slice(0, 12)}…)`),
      el('dt', {}, 'Requested'), el('dd', {}, `${approval.requested_at} (${ageOf(approval.requested_at)} ago)`),
      el('dt', {}, pending ? 'Time left' : 'Status'), pending ? left : el('dd', {}, approval.status),
      grants ? [el('dt', {}, 'Grants'), grants] : null,
      approval.decided_by ? [el('dt', {}, 'Decided by'), el('dd', { 'data-testid': 'decided-by' }, `${person(approval.decided_by)} at ${approval.decided_at}`)] : null,
      approval.reason ? [el('dt', {}, 'Reason'), el('dd', {}, approval.reason)] : null),
    el('h3', {}, 'Arguments'),
    el('pre', {}, JSON.stringify(approval.arguments, null, 2)),
    pending ? actions : null,
    outcome);
  let current = approval;
  const tick = () => { left.textContent = span(Date.parse(current.expires_at) - Date.now()); };
  const update = (fresh) => {
    current = fresh;
    if (grants) grants.textContent = grantsText(fresh);
    tick();
  };
  update(approval);
  return { node, tick, update };
}

// ---------------- Claims ----------------

function claims(main) {
  const pending = el('div');
  const committed = el('div');
  const refresh = async () => {
    try {
      const open = await api('GET', '/v1/claims?status=PENDING&limit=200');
      replace(pending, open.items.length === 0 ? el('p', { class: 'muted' }, 'No PENDING claims.') : table(
        ['Request id', 'Tool', 'Agent', 'Session', 'Team', 'Age', ''],
        open.items.map((claim) => pendingRow(claim, refresh)),
        'Claims whose outcome is unknown, oldest first'));
      const done = await api('GET', '/v1/claims?status=COMMITTED&limit=50');
      replace(committed, done.items.length === 0 ? el('p', { class: 'muted' }, 'No COMMITTED claims.') : table(
        ['Request id', 'Tool', 'Agent', 'Team', 'Committed', 'Receipt'],
        done.items.map((claim) => el('tr', {},
          el('td', {}, el('code', {}, claim.request_id)), el('td', {}, claim.action), el('td', {}, claim.agent_id),
          el('td', {}, claim.team),
          el('td', {}, claim.committed_at || ''),
          el('td', {}, el('details', {}, el('summary', {}, claim.resolution ? `resolved by ${claim.resolution.by || 'an operator'}` : 'result'),
            el('pre', {}, JSON.stringify({ action_ref: claim.action_ref, result: claim.result, resolution: claim.resolution }, null, 2)))))),
        'Claims that ran, with their receipts'));
    } catch (error) {
      replace(pending, problem(error));
    }
  };
  replace(main, el('h1', {}, 'Claims'), el('h2', {}, 'PENDING'), pending, el('h2', {}, 'COMMITTED'), committed);
  refresh();
  return () => {};
}

function pendingRow(claim, refresh) {
  const row = el('tr', {});
  const outcome = el('select', {}, el('option', { value: 'released' }, 'released (it did not run; may run again)'), el('option', { value: 'committed' }, 'committed (it ran)'));
  const result = el('textarea', { rows: 4 }, '{"jsonrpc": "2.0", "id": null, "result": {}}');
  const evidence = el('input', { type: 'text', size: 40 });
  const message = el('p', { role: 'alert' });
  const form = el('form', { hidden: true, on: { submit: async (event) => {
    event.preventDefault();
    const body = { outcome: outcome.value };
    if (evidence.value.trim()) body.evidence = evidence.value.trim();
    if (outcome.value === 'committed') {
      try { body.result = JSON.parse(result.value); } catch (error) { message.className = 'bad'; message.textContent = `result is not JSON: ${errorText(error)}`; return; }
    }
    try {
      await api('POST', `/v1/claims/${encodeURIComponent(claim.request_id)}/resolve`, body);
      say(`Claim ${claim.request_id} resolved as ${outcome.value}.`);
      refresh();
    } catch (error) { message.className = 'bad'; message.textContent = errorText(error); }
  } } },
  ...field('Outcome', outcome), ...field('Result (a JSON-RPC response; only for committed)', result), ...field('Evidence', evidence),
  el('div', { class: 'actions' }, el('button', { type: 'submit' }, 'Resolve claim')), message);
  const open = el('button', { type: 'button', class: 'secondary', on: { click: () => { form.hidden = !form.hidden; if (!form.hidden) outcome.focus(); } } }, 'Resolve…');
  row.dataset.claim = claim.request_id;
  const resolve = may('seal.claim.resolve', claim.team) ? [open, form] : [notAllowed('seal.claim.resolve', claim.team)];
  row.append(el('td', {}, el('code', {}, claim.request_id)), el('td', {}, claim.action), el('td', {}, claim.agent_id),
    el('td', {}, claim.session_id || '–'), el('td', {}, claim.team), el('td', {}, ageOf(claim.claimed_at)), el('td', {}, ...resolve));
  return row;
}

// ---------------- Sessions ----------------

function sessions(main) {
  const status = el('select', {}, ['active', 'exhausted', 'expired', 'revoked', ''].map((s) => el('option', { value: s }, s || 'all')));
  const list = el('div');
  const refresh = async () => {
    try {
      const page = await api('GET', `/v1/seal/sessions${query({ status: status.value, limit: 200 })}`);
      replace(list, page.items.length === 0 ? el('p', { class: 'muted' }, 'No sessions.') : table(
        ['Session', 'Status', 'Context', 'Team', 'Agent', 'Expires', 'Calls / budget', ''],
        page.items.map((s) => sessionRow(s, refresh)), 'Sessions by id'));
    } catch (error) { replace(list, problem(error)); }
  };
  status.addEventListener('change', refresh);
  replace(main, el('h1', {}, 'Sessions'), el('div', { class: 'filters' }, el('div', {}, ...field('Status', status))), list);
  return every(POLL_MS * 2, refresh);
}

function sessionRow(session, refresh) {
  const cell = el('td');
  const live = session.status === 'active' || session.status === 'exhausted';
  const ask = el('button', { type: 'button', class: 'danger', on: { click: () => {
    replace(cell, el('span', {}, `Revoke ${session.session_id}? `),
      el('button', { type: 'button', class: 'danger', on: { click: async () => {
        try {
          await api('DELETE', `/v1/seal/sessions/${encodeURIComponent(session.session_id)}`);
          say(`Session ${session.session_id} revoked.`);
          refresh();
        } catch (error) { replace(cell, problem(error)); }
      } } }, 'Yes, revoke'), ' ',
      el('button', { type: 'button', class: 'secondary', on: { click: () => replace(cell, ask) } }, 'Cancel'));
    cell.querySelector('button').focus();
  } } }, 'Revoke');
  if (live && may('seal.session.revoke', session.team)) cell.append(ask);
  const budget = session.budget.max_calls === null || session.budget.max_calls === undefined ? '∞' : session.budget.max_calls;
  return el('tr', { 'data-session': session.session_id },
    el('td', {}, el('code', {}, session.session_id)), el('td', {}, session.status), el('td', {}, session.security_context),
    el('td', {}, session.team), el('td', {}, session.agent_id || '–'), el('td', {}, `${session.expires_at} (${span(Date.parse(session.expires_at) - Date.now())})`),
    el('td', {}, `${session.calls.allowed} / ${budget}`), cell);
}

// ---------------- Security contexts ----------------

let schemaPromise = null;
function schema() {
  schemaPromise ||= fetch('/console/schema.json').then((r) => r.json());
  return schemaPromise;
}

// The spec as in its file: the API adds `version`, `source` and `shadow_version`.
function specOf(context) {
  const { version, source, shadow_version: shadow, ...spec } = context;
  return spec;
}

function contexts(main) {
  const list = el('div');
  const detail = el('section', { 'aria-label': 'Selected context' });
  const show = async (name) => {
    try { renderContext(detail, await api('GET', `/v1/security-contexts/${encodeURIComponent(name)}`), reload); } catch (error) { replace(detail, problem(error)); }
  };
  const reload = async (select) => {
    try {
      const page = await api('GET', '/v1/security-contexts');
      replace(list, table(['Name', 'Team', 'Source', 'Version', 'Capabilities'], page.items.map((c) => el('tr', { 'data-context': c.name },
        el('td', {}, el('button', { type: 'button', class: 'secondary', on: { click: () => show(c.name) } }, c.name)),
        el('td', {}, c.team),
        el('td', {}, c.source.kind === 'file' ? `file ${c.source.path}` : 'API (store)'),
        el('td', {}, el('code', {}, c.version.slice(0, 12))), el('td', {}, String(c.capabilities.length)))), 'Loaded contexts'));
      if (select) show(select);
    } catch (error) { replace(list, problem(error)); }
  };
  const newName = el('input', { type: 'text', size: 24 });
  const create = el('form', { class: 'filters', on: { submit: (event) => {
    event.preventDefault();
    const name = newName.value.trim();
    if (!name) return;
    renderContext(detail, { name, capabilities: [], source: { kind: 'store' }, version: null }, reload);
  } } }, el('div', {}, ...field('New API-managed context', newName)), el('button', { type: 'submit', class: 'secondary' }, 'Draft it'));
  // A new context needs the write scope on some team (the draft's `team` says which).
  replace(main, el('h1', {}, 'Security contexts'), list, may('seal.context.write') ? create : null, detail);
  reload();
  return () => {};
}

function capabilityTable(spec) {
  const known = ['tool_pattern', 'claim', 'path_allowlist', 'rate_limit', 'max_response_size'];
  return table(['Tool pattern', 'Claim', 'Paths', 'Rate limit', 'Max response', 'Other'],
    (spec.capabilities || []).map((cap) => {
      const others = Object.fromEntries(Object.entries(cap).filter(([k]) => !known.includes(k)));
      return el('tr', {},
        el('td', {}, el('code', {}, cap.tool_pattern)), el('td', {}, cap.claim || 'explicit'),
        el('td', {}, (cap.path_allowlist || []).join(', ') || '–'),
        el('td', {}, cap.rate_limit ? `${cap.rate_limit.calls} per ${cap.rate_limit.per_seconds} s` : '–'),
        el('td', {}, cap.max_response_size ? `${cap.max_response_size} B` : '–'),
        el('td', {}, Object.keys(others).length ? el('code', {}, JSON.stringify(others)) : '–'));
    }), `Capabilities of ${spec.name}, first match decides; deny list: ${(spec.deny_list || []).join(', ') || 'none'}`);
}

function renderContext(detail, context, reload) {
  const spec = specOf(context);
  const inStore = context.source.kind === 'store';
  // A new draft has no team yet: the save checks the one it names.
  const writable = context.team === undefined ? may('seal.context.write') : may('seal.context.write', context.team);
  const editable = inStore && writable;
  let where = `From the file ${context.source.path}: read-only here; edit the file.`;
  if (inStore) where = editable ? 'Managed through the API: editable here.' : `Managed through the API; changing it needs seal.context.write on team ${context.team}.`;
  const parts = [el('h2', {}, `Context ${context.name}`),
    el('p', { class: 'muted' }, where),
    el('div', { class: 'row' }, el('div', {}, capabilityTable(spec)), el('div', {}, el('h3', {}, 'YAML'), el('pre', { 'data-testid': 'context-yaml' }, toYaml(spec))))];
  const edit = editable ? editor(context, spec, reload) : null;
  if (edit) parts.push(edit.node);
  // The dry run evaluates the editor's draft while it is valid, else the saved version.
  if (edit || context.version) parts.push(tryCall(context.name, edit ? edit.draft : () => null));
  const shadow = el('section', { 'aria-label': 'Shadow version' });
  if (context.shadow_version) parts.push(shadow);
  replace(detail, ...parts);
  if (context.shadow_version) showShadow(shadow, context, spec);
}

// SPEC 6.4 r4: a candidate version that decides every call beside the one in force, which alone takes
// effect. Shows what changes, and how often the two decided differently, by tool and pair of decisions.
async function showShadow(section, context, spec) {
  let shadow;
  try {
    shadow = await api('GET', `/v1/security-contexts/${encodeURIComponent(context.name)}/shadow`);
  } catch (error) {
    replace(section, problem(error));
    return;
  }
  const { summary, live_version: live, ...rest } = shadow;
  const lines = diffLines(toYaml(spec), toYaml(specOf(rest)));
  const from = shadow.source.kind === 'file' ? `the file ${shadow.source.path}` : 'the API (store)';
  const since = summary.first_call_at ? `since ${summary.first_call_at}` : 'no call yet';
  replace(section, el('h3', {}, `Shadow version ${shadow.version.slice(0, 12)}`),
    el('p', { class: 'muted' }, `From ${from}; it decides every call beside version ${String(live).slice(0, 12)}, which alone takes effect.`),
    el('p', { 'data-testid': 'shadow-summary' }, `${summary.calls} calls decided (${since}), ${summary.differed} differently.`),
    table(['Tool', 'Live', 'Shadow', 'Calls'], summary.differences.map((d) => el('tr', { 'data-testid': 'shadow-difference' },
      el('td', {}, el('code', {}, d.tool)), el('td', {}, d.live), el('td', {}, d.shadow), el('td', {}, String(d.calls)))),
    'Where the decisions differed'),
    el('h3', {}, 'What promoting it changes'),
    el('pre', { class: 'diff', 'data-testid': 'shadow-diff' }, lines.map((l) => el('span', { class: l.op === '+' ? 'add' : l.op === '-' ? 'del' : '' }, `${l.op} ${l.line}\n`))));
}

function editor(context, spec, reload) {
  const original = JSON.stringify(spec, null, 2);
  const text = el('textarea', { rows: 18, spellcheck: 'false', 'aria-describedby': 'draft-errors' }, original);
  const errors = el('ul', { id: 'draft-errors', class: 'errors', 'aria-live': 'polite' });
  const review = el('div');
  const message = el('p', { role: 'alert' });
  let draft = null;
  const check = async () => {
    replace(review);
    draft = null;
    let value;
    try { value = JSON.parse(text.value); } catch (error) { replace(errors, el('li', {}, `Not JSON: ${errorText(error)}`)); return; }
    const found = validate(await schema(), value);
    if (value && typeof value === 'object' && value.name !== context.name) found.push({ path: 'name', message: `must stay ${JSON.stringify(context.name)}` });
    replace(errors, found.map((e) => el('li', {}, `${e.path}: ${e.message}`)));
    if (found.length === 0) draft = value;
  };
  text.addEventListener('input', check);
  const showDiff = () => {
    if (!draft) { message.className = 'bad'; message.textContent = 'Fix the errors above first; nothing was saved.'; return; }
    message.textContent = '';
    const lines = diffLines(context.version ? toYaml(spec) : '', toYaml(draft));
    const changed = lines.some((l) => l.op !== ' ');
    replace(review, el('h3', {}, 'What the save changes'),
      el('pre', { class: 'diff', 'data-testid': 'diff' }, lines.map((l) => el('span', { class: l.op === '+' ? 'add' : l.op === '-' ? 'del' : '' }, `${l.op} ${l.line}\n`))),
      el('div', { class: 'actions' }, el('button', { type: 'button', disabled: !changed, on: { click: save } }, changed ? 'Save' : 'No change to save')));
  };
  const save = async () => {
    try {
      const saved = await api('PUT', `/v1/security-contexts/${encodeURIComponent(context.name)}`, draft);
      say(`Context ${context.name} saved (version ${saved.version.slice(0, 12)}).`);
      reload(context.name);
    } catch (error) { message.className = 'bad'; message.textContent = `Not saved: ${errorText(error)}`; }
  };
  check();
  const node = el('div', { class: 'card' }, el('h3', {}, 'Edit (JSON, checked against the policy schema as you type)'),
    ...field('Draft', text), errors,
    el('div', { class: 'actions' }, el('button', { type: 'button', on: { click: showDiff } }, 'Review changes')), message, review);
  // Unchanged text is the saved version, not a draft.
  return { node, draft: () => (draft && text.value !== original ? draft : null) };
}

// The deciding rule, e.g. {kind: capability, pattern: shop.*, index: 0} → "kind capability · pattern shop.* · index 0".
function describeRule(rule) {
  if (!rule || typeof rule !== 'object') return String(rule ?? '–');
  return Object.entries(rule).map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' · ');
}

function tryCall(name, currentDraft) {
  const tool = el('input', { type: 'text', size: 30, placeholder: 'tool.name' });
  const args = el('textarea', { rows: 3, spellcheck: 'false' }, '{}');
  const answer = el('div', { 'aria-live': 'polite' });
  const form = el('form', { on: { submit: async (event) => {
    event.preventDefault();
    let argumentsValue;
    try { argumentsValue = JSON.parse(args.value); } catch (error) { replace(answer, problem(`arguments are not JSON: ${errorText(error)}`)); return; }
    try {
      const draft = currentDraft();
      const request = { tool: tool.value.trim(), arguments: argumentsValue };
      if (draft) request.draft = draft;
      const result = await api('POST', `/v1/security-contexts/${encodeURIComponent(name)}/evaluate`, request);
      replace(answer, el('dl', { class: 'facts', 'data-testid': 'decision' },
        el('dt', {}, 'Decision'), el('dd', { class: result.decision === 'allow' ? 'ok' : 'bad' }, result.decision === 'allow' ? 'allow' : `deny ${result.code} ${result.name}`),
        result.message ? [el('dt', {}, 'Why'), el('dd', {}, result.message)] : null,
        el('dt', {}, 'Rule'), el('dd', {}, describeRule(result.rule)),
        el('dt', {}, 'Evaluated'), el('dd', {}, draft ? 'the draft (not saved)' : 'the saved version'),
        el('dt', {}, 'Context version'), el('dd', {}, el('code', {}, String(result.context_version).slice(0, 12)))));
    } catch (error) { replace(answer, problem(error)); }
  } } },
  el('h3', {}, 'Try a call (dry run of the draft while the editor holds a valid one, else of the saved version; nothing is called)'),
  ...field('Tool', tool), ...field('Arguments (JSON)', args),
  el('div', { class: 'actions' }, el('button', { type: 'submit' }, 'Try')), answer);
  return el('div', { class: 'card' }, form);
}

// ---------------- Tools (SPEC 18) ----------------

// Format characters (zero-width, bidi controls, the tag block) shown as escapes: the reviewer must see
// what a model would read.
function visible(text) {
  return text.replace(/\p{Cf}/gu, (c) => `\\u{${c.codePointAt(0).toString(16).toUpperCase()}}`);
}

function definitionText(view) {
  return view ? visible(JSON.stringify(view.definition, null, 2)) : '';
}

// The pinned definition beside the one seen, each line marked where they differ.
function sideBySide(tool) {
  const lines = diffLines(definitionText(tool.pinned), definitionText(tool.seen));
  const column = (title, view, shown, mark) => el('div', {},
    el('h3', {}, title),
    el('p', { class: 'muted' }, view ? `sha256 ${view.definition_sha256}` : 'none'),
    el('pre', { class: 'diff', 'data-testid': `${mark === 'del' ? 'pinned' : 'seen'}-definition` },
      lines.filter((l) => l.op === ' ' || l.op === shown)
        .map((l) => el('span', { class: l.op === ' ' ? '' : mark }, `${l.op === ' ' ? ' ' : l.op} ${l.line}\n`))));
  return el('div', { class: 'row' },
    column('Pinned', tool.pinned, '-', 'del'),
    column('Seen now', tool.seen, '+', 'add'));
}

function toolCard(tool, refresh) {
  const message = el('p', { role: 'alert' });
  const accept = async () => {
    try {
      await api('POST', `/v1/tools/${encodeURIComponent(tool.tool)}/accept`, { definition_sha256: tool.seen.definition_sha256 });
      say(`${tool.tool}: the definition seen is pinned.`);
      refresh();
    } catch (error) { message.className = 'bad'; message.textContent = `Not accepted: ${errorText(error)}`; }
  };
  const actions = !tool.seen ? el('p', { class: 'muted' }, 'The upstream does not list it now.')
    : mayEverywhere('seal.tool.review')
      ? el('div', { class: 'actions' }, el('button', { type: 'button', 'data-testid': 'accept-tool', on: { click: accept } }, 'Accept the definition seen'))
      : el('p', { class: 'muted', 'data-testid': 'not-allowed' }, 'You may not accept it: it needs seal.tool.review on every team.');
  return el('div', { class: 'card', 'data-testid': 'withheld-tool' },
    el('h2', {}, `${tool.tool} — withheld: ${tool.reason.replace('_', ' ')}`),
    sideBySide(tool), actions, message);
}

function tools(main) {
  const list = el('div', { 'aria-live': 'polite' });
  const refresh = async () => {
    let page;
    try { page = await api('GET', '/v1/tools'); } catch (error) { replace(list, problem(error)); return; }
    if (page.items.length === 0) { replace(list, el('p', { class: 'muted' }, 'No MCP upstream lists any tool.')); return; }
    const rows = page.items.map((tool) => el('tr', { 'data-testid': 'tool-row' },
      el('td', {}, el('code', {}, tool.tool)),
      el('td', { class: tool.withheld ? 'bad' : 'ok' }, tool.status),
      el('td', {}, tool.withheld ? `withheld: ${tool.reason}` : 'listed'),
      el('td', {}, tool.pinned ? el('code', {}, tool.pinned.definition_sha256.slice(0, 16)) : 'none')));
    replace(list,
      table(['tool', 'status', 'calls', 'pinned sha256'], rows, 'Every tool of every MCP upstream'),
      ...page.items.filter((tool) => tool.withheld).map((tool) => toolCard(tool, refresh)));
  };
  replace(main, el('h1', {}, 'Tools'),
    el('p', { class: 'muted' }, 'A tool whose definition is not the pinned one is left out of tools/list and its calls are refused (2009) until it is accepted.'),
    list);
  refresh();
  // No polling: a card being read must not move under the reader; the page reloads after an accept.
  return () => {};
}

// ---------------- Audit ----------------

const EVENT_TYPES = ['SessionCreated', 'SessionRevoked', 'ToolCallAuthorized', 'PolicyViolationBlocked', 'SignatureVerificationFailed',
  'SecurityTokenExpired', 'EnvelopeRejected', 'ToolCallCompleted', 'ToolCallFailed', 'ClaimSkipped', 'ClaimBlocked', 'ClaimResolved',
  'SecurityContextChanged', 'SecurityContextRejected', 'ClaimTaken', 'ClaimSettled',
  'ApprovalRequested', 'ApprovalGranted', 'ApprovalDenied', 'ApprovalUsed', 'ApprovalExpired', 'AuditCheckpoint',
  'ToolDefinitionChanged', 'ToolDefinitionAccepted', 'AnswerGuarded', 'ShadowDecisionDiffered'];

function audit(main) {
  const filters = {
    type: el('select', {}, el('option', { value: '' }, 'any'), EVENT_TYPES.map((t) => el('option', { value: t }, t))),
    session_id: el('input', { type: 'text', size: 18 }),
    sub: el('input', { type: 'text', size: 14 }),
    tool: el('input', { type: 'text', size: 16 }),
    decision: el('select', {}, ['', 'allow', 'deny'].map((d) => el('option', { value: d }, d || 'any'))),
    code: el('input', { type: 'text', inputmode: 'numeric', size: 6 }),
  };
  const labels = { type: 'Type', session_id: 'Session', sub: 'Agent', tool: 'Tool', decision: 'Decision', code: 'Code' };
  const results = el('div', { 'data-testid': 'events' });
  const signed = el('div', { 'data-testid': 'checkpoints' });
  const more = el('div', { class: 'actions' });
  const chain = el('p', { 'data-testid': 'chain-status' }, 'Verifying the chain…');
  let cursor = null;
  const load = async (append) => {
    const params = Object.fromEntries(Object.entries(filters).map(([k, input]) => [k, input.value.trim()]));
    try {
      const page = await api('GET', `/v1/audit${query({ ...params, limit: 100, cursor: append ? cursor : '' })}`);
      cursor = page.next_cursor;
      const rows = page.items.map((e) => el('tr', {},
        el('td', {}, String(e.seq)), el('td', {}, e.at), el('td', {}, e.type),
        el('td', {}, e.decision ? `${e.decision}${e.code ? ` ${e.code}` : ''}` : (e.code ? String(e.code) : '')),
        el('td', {}, e.tool || ''), el('td', {}, e.session_id || ''), el('td', {}, e.sub || (e.actor ? person(e.actor) : '')),
        el('td', {}, e.team || ''),
        el('td', {}, el('details', {}, el('summary', {}, 'event'), el('pre', {}, JSON.stringify(e, null, 2))))));
      if (append && results.querySelector('tbody')) results.querySelector('tbody').append(...rows);
      else replace(results, page.items.length === 0 ? el('p', { class: 'muted' }, 'No events match.') : table(['Seq', 'At', 'Type', 'Decision', 'Tool', 'Session', 'Agent', 'Team', ''], rows, 'Events, newest first'));
      replace(more, cursor ? el('button', { type: 'button', class: 'secondary', on: { click: () => load(true) } }, 'Older events') : null);
    } catch (error) { replace(results, problem(error)); }
  };
  const exportText = () => apiText('/v1/audit/export');
  const download = async () => {
    try {
      const blob = new Blob([await exportText()], { type: 'application/x-ndjson' });
      const link = el('a', { href: URL.createObjectURL(blob), download: 'sealgate-audit.jsonl' });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
      say('Export downloaded: check it with `sealgate audit verify sealgate-audit.jsonl`.');
    } catch (error) { say(errorText(error)); }
  };
  // The newest checkpoints, each signature checked here with the keys of /v1/keys (SPEC 14).
  const loadCheckpoints = async (keys) => {
    try {
      const page = await api('GET', '/v1/audit/checkpoints?limit=20');
      if (page.items.length === 0) {
        replace(signed, el('p', { class: 'muted' }, 'No signed checkpoint yet (one follows every audit.checkpoint_every events, and every audit.checkpoint_secs while events are unsigned).'));
        return;
      }
      const rows = await Promise.all(page.items.map(async (e) => {
        const check = await verifyCheckpoint(e, keys);
        return el('tr', { 'data-checkpoint': e.seq },
          el('td', {}, String(e.seq)), el('td', {}, e.at), el('td', {}, `seq 1–${e.checkpoint.seq}`),
          el('td', {}, e.checkpoint.kid), el('td', {}, e.replica || ''),
          el('td', { class: check.ok ? 'ok' : 'bad', 'data-testid': 'checkpoint-status' }, check.ok ? 'signature verified' : `NOT verified: ${check.reason}`));
      }));
      replace(signed, table(['Seq', 'At', 'Signs', 'Key', 'Replica', 'Signature'], rows, 'Signed checkpoints, newest first, checked in this browser'));
    } catch (error) { replace(signed, problem(error)); }
  };
  const verify = async () => {
    chain.className = '';
    chain.textContent = 'Verifying the chain…';
    try {
      const keys = await signingKeys();
      loadCheckpoints(keys);
      const report = await verifyExport(await exportText(), keys);
      chain.className = report.ok ? 'ok' : 'bad';
      chain.textContent = report.ok
        ? `Chain intact: ${report.events} events verified in this browser; ${report.checkpoints} signed checkpoints verified, ${report.unsigned} events after the last.`
        : `Chain NOT verified${report.seq ? ` at seq ${report.seq}` : ''}: ${report.reason}`;
    } catch (error) { chain.className = 'bad'; chain.textContent = errorText(error); }
  };
  const form = el('form', { class: 'filters', on: { submit: (event) => { event.preventDefault(); load(false); } } },
    Object.entries(filters).map(([k, input]) => el('div', {}, ...field(labels[k], input))),
    el('button', { type: 'submit' }, 'Filter'));
  // The chain links every team's events together: an export without another team's events would not
  // verify, so the gateway serves the export and the checkpoints only to a reader of every team (SPEC 16).
  // Someone bound to some teams reads their events through the query, which the gateway filters.
  if (!mayEverywhere('seal.audit.read')) {
    replace(main, el('h1', {}, 'Audit'),
      el('p', { class: 'muted', 'data-testid': 'chain-status' },
        `The events of ${teamNames('seal.audit.read')}. The hash chain and its signed checkpoints hold every team's events together, `
        + 'so they are exported and verified by someone who reads every team (sealgate audit verify).'),
      el('h2', {}, 'Events'), form, results, more);
    load(false);
    return () => {};
  }
  replace(main, el('h1', {}, 'Audit'),
    el('div', { class: 'actions' }, chain,
      el('button', { type: 'button', class: 'secondary', on: { click: verify } }, 'Verify again'),
      el('button', { type: 'button', class: 'secondary', on: { click: download } }, 'Download export')),
    el('h2', {}, 'Signed checkpoints'), signed,
    el('h2', {}, 'Events'), form, results, more);
  load(false);
  verify();
  return () => {};
}

export const pages = { overview, approvals, claims, sessions, contexts, audit, tools };
