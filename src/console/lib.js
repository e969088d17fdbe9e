// Helpers of the console: DOM building (text only, never HTML), the control API with the operator's
// token, YAML and diffs for the context editor, a JSON Schema subset, metrics parsing and SVG charts.

const TOKEN_KEY = 'sealgate.operator_token';

// Session storage: the token dies with the tab and is never sent by the browser on its own (no cookie).
export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// el('td', {class: 'x', on: {click: f}}, 'text', child) — strings become text nodes.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === 'on') {
      for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    } else if (value === true) {
      node.setAttribute(name, '');
    } else if (value !== false && value !== null && value !== undefined) {
      node.setAttribute(name, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

let idCounter = 0;
// A labelled field: returns [label, control] with the label bound to the control.
export function field(text, control) {
  if (!control.id) control.id = `f${++idCounter}`;
  return [el('label', { for: control.id }, text), control];
}

export function say(message) {
  document.getElementById('status').textContent = message;
}

export class ApiFailure extends Error {
  constructor(status, body, path) {
    const error = body && body.error;
    // The HTTP status as well as the code: 409 (6004) and 409 for a decided request differ only there.
    const detail = error ? `HTTP ${status}, ${error.code} ${error.name || ''}: ${error.message}` : `HTTP ${status}`;
    super(`${path}: ${detail}`);
    this.status = status;
    this.body = body;
  }
}

// A person signed in with the identity provider (SPEC 16): GET /console/session's answer. The browser
// sends the session's HttpOnly cookie by itself; every change carries the session's CSRF token.
export const person = { current: null };

// Set once a sign-in with the provider came back to this browser (the callback sends it to
// /console/#signed-in): only then is /console/session asked, so that a console used with pasted tokens
// never meets its 401. Not a secret: the session itself is the HttpOnly cookie.
const PROVIDER_KEY = 'sealgate.signed_in_with_provider';

// Who is signed in with the provider, or null (no console session, or sign-in not configured).
export async function loadPerson() {
  if (window.location.hash === '#signed-in') {
    localStorage.setItem(PROVIDER_KEY, '1');
    window.history.replaceState(null, '', `${window.location.pathname}#/overview`);
  }
  person.current = null;
  if (!localStorage.getItem(PROVIDER_KEY)) return null;
  const response = await fetch('/console/session', { cache: 'no-store' });
  if (response.ok) person.current = await response.json();
  else localStorage.removeItem(PROVIDER_KEY);
  return person.current;
}

// After logout: pasted tokens again, without asking /console/session.
export function forgetPerson() {
  person.current = null;
  localStorage.removeItem(PROVIDER_KEY);
}

// A control API request as the signed-in person (the browser sends their cookie by itself; a change
// carries the session's CSRF token) or with the pasted token; throws ApiFailure on any non-2xx answer.
async function send(method, path, body) {
  const headers = {};
  if (person.current) {
    if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = person.current.csrf_token;
  } else {
    headers.Authorization = `Bearer ${token.get() || ''}`;
  }
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw new ApiFailure(response.status, parsed(await response.text()), `${method} ${path}`);
  return response;
}

function parsed(text) {
  try { return text ? JSON.parse(text) : null; } catch { return text; }
}

// Calls the control API; answers the parsed body.
export async function api(method, path, body) {
  return parsed(await (await send(method, path, body)).text());
}

// A GET whose answer is not JSON (the audit export, JSON lines): its text.
export async function apiText(path) {
  return (await send('GET', path)).text();
}

// ---- What the caller may do (SPEC 16) ----

// The caller's scopes as {TEAM: [SCOPE, …]} (`*`: every team): the signed-in person's from
// /console/session, or the pasted token's `scope` claim read without verifying it. Pages use it only to
// offer the actions the gateway would accept; the gateway decides every request itself. Null when the
// token's claims cannot be read: then everything is offered and the gateway's answer says what is not.
function heldScopes() {
  if (person.current) return person.current.scopes;
  try {
    const claims = JSON.parse(new TextDecoder().decode(unb64url(token.get().split('.')[1])));
    if (claims.scope === undefined) return {};
    if (typeof claims.scope !== 'string') return null;
    const byTeam = {};
    for (const raw of claims.scope.split(' ').filter(Boolean)) {
      const slash = raw.indexOf('/');
      const [team, scope] = slash < 0 ? ['*', raw] : [raw.slice(0, slash), raw.slice(slash + 1)];
      (byTeam[team] ||= []).push(scope);
    }
    return byTeam;
  } catch {
    return null;
  }
}

const grantsScope = (list, scope) => Boolean(list) && (list.includes(scope) || list.includes('seal.admin'));

// The teams on which `scope` is held: ['*'] for every team; null when unknown.
export function teamsWith(scope) {
  const held = heldScopes();
  if (!held) return null;
  if (grantsScope(held['*'], scope)) return ['*'];
  return Object.keys(held).filter((team) => grantsScope(held[team], scope));
}

// Whether `scope` is held on `team` (or, without a team, on at least one).
export function may(scope, team) {
  const teams = teamsWith(scope);
  if (!teams) return true;
  return team === undefined ? teams.length > 0 : teams.includes('*') || teams.includes(team);
}

// Whether `scope` is held on every team: what gateway-wide things (metrics, the audit chain) need.
export function mayEverywhere(scope) {
  const teams = teamsWith(scope);
  return !teams || teams.includes('*');
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== '' && value !== null && value !== undefined) search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

// "3 min 20 s" from milliseconds; negative spans say "expired".
export function span(ms) {
  if (ms < 0) return 'expired';
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function errorText(error) {
  return error instanceof Error ? error.message : String(error);
}

// ---- YAML (display only: what the context looks like in its policy file) ----

function yamlScalar(value) {
  if (typeof value === 'string') {
    // Plain when YAML would read it back as the same string, quoted (JSON quoting is valid YAML) otherwise.
    const plain = /^[A-Za-z0-9_./][A-Za-z0-9_./* -]*$/.test(value) && !/^(true|false|null|yes|no|on|off|~|[-+.0-9].*)$/i.test(value) && !value.endsWith(' ');
    return plain ? value : JSON.stringify(value);
  }
  return JSON.stringify(value);
}

export function toYaml(value, indent = '') {
  if (Array.isArray(value)) {
    if (value.length === 0) return '[]';
    return value.map((item) => {
      const inner = toYaml(item, `${indent}  `);
      if (item && typeof item === 'object' && Object.keys(item).length) {
        return `${indent}- ${inner.trimStart()}`;
      }
      return `${indent}- ${inner}`;
    }).join('\n');
  }
  if (value && typeof value === 'object') {
    const keys = Object.keys(value);
    if (keys.length === 0) return '{}';
    return keys.map((key) => {
      const item = value[key];
      if (item && typeof item === 'object' && (Array.isArray(item) ? item.length : Object.keys(item).length)) {
        return `${indent}${key}:\n${toYaml(item, `${indent}  `)}`;
      }
      return `${indent}${key}: ${toYaml(item, `${indent}  `)}`;
    }).join('\n');
  }
  return yamlScalar(value);
}

// ---- Line diff (longest common subsequence), for "what the save changes" ----

export function diffLines(before, after) {
  const a = before.split('\n');
  const b = after.split('\n');
  const lengths = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i -= 1) {
    for (let j = b.length - 1; j >= 0; j -= 1) {
      lengths[i][j] = a[i] === b[j] ? lengths[i + 1][j + 1] + 1 : Math.max(lengths[i + 1][j], lengths[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      out.push({ op: ' ', line: a[i] }); i += 1; j += 1;
    } else if (j < b.length && (i === a.length || lengths[i][j + 1] >= lengths[i + 1][j])) {
      out.push({ op: '+', line: b[j] }); j += 1;
    } else {
      out.push({ op: '-', line: a[i] }); i += 1;
    }
  }
  return out;
}

// ---- JSON Schema: the keywords policies/schema.json uses (draft 2020-12 subset) ----

function typeOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

function typeMatches(wanted, actual) {
  return wanted === actual || (wanted === 'number' && actual === 'integer');
}

function resolveRef(root, ref) {
  return ref.replace(/^#\//, '').split('/').reduce((node, part) => node[part.replace(/~1/g, '/').replace(/~0/g, '~')], root);
}

// Errors of `value` against `schema`: [{path, message}], empty when valid.
export function validate(root, value, schema = root, path = '') {
  const at = path || '(top)';
  if (schema === true || schema === undefined) return [];
  if (schema === false) return [{ path: at, message: 'is not allowed here' }];
  if (schema.$ref) return validate(root, value, resolveRef(root, schema.$ref), path);
  const errors = [];
  const actual = typeOf(value);
  if (schema.type !== undefined) {
    const wanted = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!wanted.some((t) => typeMatches(t, actual))) {
      return [{ path: at, message: `must be ${wanted.join(' or ')}, not ${actual}` }];
    }
  }
  if ('const' in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) {
    errors.push({ path: at, message: `must be ${JSON.stringify(schema.const)}` });
  }
  if (schema.enum && !schema.enum.some((option) => JSON.stringify(option) === JSON.stringify(value))) {
    errors.push({ path: at, message: `must be one of ${schema.enum.map((o) => JSON.stringify(o)).join(', ')}` });
  }
  if (schema.oneOf) {
    const passing = schema.oneOf.filter((option) => validate(root, value, option, path).length === 0).length;
    if (passing !== 1) {
      const options = schema.oneOf.map((o) => (o.$ref ? o.$ref.split('/').pop() : JSON.stringify(o.const ?? o.type ?? o))).join(', ');
      errors.push({ path: at, message: passing === 0 ? `matches none of: ${options}` : 'matches more than one allowed form' });
    }
  }
  if (actual === 'string') {
    if (schema.minLength !== undefined && [...value].length < schema.minLength) errors.push({ path: at, message: `must be at least ${schema.minLength} characters` });
    if (schema.maxLength !== undefined && [...value].length > schema.maxLength) errors.push({ path: at, message: `must be at most ${schema.maxLength} characters` });
    if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value)) errors.push({ path: at, message: `${JSON.stringify(value)} does not match ${schema.pattern}` });
  }
  if ((actual === 'integer' || actual === 'number') && schema.minimum !== undefined && value < schema.minimum) {
    errors.push({ path: at, message: `must be at least ${schema.minimum}` });
  }
  if (actual === 'array') {
    if (schema.minItems !== undefined && value.length < schema.minItems) errors.push({ path: at, message: `needs at least ${schema.minItems} item(s)` });
    if (schema.items) value.forEach((item, i) => errors.push(...validate(root, item, schema.items, `${path}[${i}]`)));
  }
  if (actual === 'object') {
    const properties = schema.properties || {};
    for (const key of schema.required || []) {
      if (!(key in value)) errors.push({ path: at, message: `${key} is required` });
    }
    for (const [key, item] of Object.entries(value)) {
      const child = path ? `${path}.${key}` : key;
      if (key in properties) {
        errors.push(...validate(root, item, properties[key], child));
      } else if (schema.additionalProperties === false) {
        errors.push({ path: child, message: 'is not a known field' });
      } else if (typeof schema.additionalProperties === 'object') {
        errors.push(...validate(root, item, schema.additionalProperties, child));
      }
    }
  }
  return errors;
}

// ---- Prometheus text format ----

// [{name, labels: {..}, value}] of every sample line.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[3] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

// The q-quantile (seconds) from cumulative histogram buckets [{le, count}], linear within a bucket.
export function quantile(buckets, q) {
  const sorted = buckets.filter((b) => Number.isFinite(b.le)).sort((x, y) => x.le - y.le);
  const inf = buckets.find((b) => !Number.isFinite(b.le));
  const total = inf ? inf.count : (sorted.length ? sorted[sorted.length - 1].count : 0);
  if (total <= 0) return null;
  const rank = q * total;
  let previousLe = 0;
  let previousCount = 0;
  for (const bucket of sorted) {
    if (bucket.count >= rank) {
      const inBucket = bucket.count - previousCount;
      return inBucket > 0 ? previousLe + ((bucket.le - previousLe) * (rank - previousCount)) / inBucket : bucket.le;
    }
    previousLe = bucket.le;
    previousCount = bucket.count;
  }
  return previousLe; // beyond the last finite bucket: report its bound
}

// ---- SVG charts ----

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

// A line over `points` ([{t, v}]) with its maximum labelled; `title` is the accessible name.
export function lineChart(title, points, unit) {
  const width = 320;
  const height = 140;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': title });
  chart.append(svg('title', {}, title));
  if (points.length < 2) {
    chart.append(svg('text', { x: 10, y: 70 }, 'collecting samples…'));
    return chart;
  }
  const max = Math.max(...points.map((p) => p.v));
  const scale = max > 0 ? max : 1;
  const t0 = points[0].t;
  const tSpan = Math.max(points[points.length - 1].t - t0, 1);
  const coords = points.map((p) => `${(10 + ((p.t - t0) / tSpan) * (width - 20)).toFixed(1)},${(height - 20 - (p.v / scale) * (height - 40)).toFixed(1)}`);
  chart.append(svg('polyline', { class: 'line', points: coords.join(' ') }));
  chart.append(svg('text', { x: 10, y: 14 }, `max ${formatNumber(max)} ${unit}`));
  chart.append(svg('text', { x: 10, y: height - 5 }, `last ${span(tSpan)}`));
  return chart;
}

// Bars for `entries` ([{label, v}]).
export function barChart(title, entries) {
  const width = 320;
  const height = 140;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': title });
  chart.append(svg('title', {}, title));
  if (entries.length === 0) {
    chart.append(svg('text', { x: 10, y: 70 }, 'none yet'));
    return chart;
  }
  const max = Math.max(...entries.map((e) => e.v), 1);
  const slot = (width - 20) / entries.length;
  entries.forEach((entry, i) => {
    const barHeight = (entry.v / max) * (height - 45);
    const x = 10 + i * slot;
    chart.append(svg('rect', { class: 'bar', x: x + 2, y: height - 25 - barHeight, width: Math.max(slot - 4, 2), height: barHeight }));
    chart.append(svg('text', { x: x + 2, y: height - 12 }, entry.label));
    chart.append(svg('text', { x: x + 2, y: height - 28 - barHeight }, formatNumber(entry.v)));
  });
  return chart;
}

export function formatNumber(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  if (Math.abs(n) >= 100 || Number.isInteger(n)) return String(Math.round(n));
  return n.toPrecision(3);
}

// ---- Audit chain (SPEC 9.2): hash = hex(SHA-256(JCS(event without hash))), prev_hash links ----

// JCS for the values events hold (strings, safe integers, booleans, null, objects, arrays): ECMAScript
// serialisation with keys in UTF-16 code-unit order, which is what JSON.stringify and sort() give.
function jcs(value) {
  if (Array.isArray(value)) return `[${value.map(jcs).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${jcs(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

async function sha256Hex(text) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

// ---- Signed checkpoints (SPEC 14): Ed25519 over JCS({"chain": "sealgate-audit/v1", "seq", "hash"}) ----

function unb64url(text) {
  const base64 = text.replace(/-/g, '+').replace(/_/g, '/');
  return Uint8Array.from(atob(base64 + '='.repeat((4 - (base64.length % 4)) % 4)), (c) => c.charCodeAt(0));
}

// The gateway's JWK Set (GET /v1/keys, no token) as WebCrypto keys by kid.
export async function signingKeys() {
  const response = await fetch('/v1/keys');
  if (!response.ok) throw new ApiFailure(response.status, await response.json().catch(() => null), 'GET /v1/keys');
  const keys = new Map();
  for (const jwk of (await response.json()).keys) {
    const key = await crypto.subtle.importKey('jwk', { kty: 'OKP', crv: 'Ed25519', x: jwk.x }, { name: 'Ed25519' }, false, ['verify']);
    keys.set(jwk.kid, key);
  }
  return keys;
}

// An AuditCheckpoint event: {ok} when it signs the event just before it with a key of `keys`, else {ok: false, reason}.
export async function verifyCheckpoint(event, keys) {
  const signed = event.checkpoint || {};
  if (signed.seq !== event.seq - 1 || signed.hash !== event.prev_hash) {
    return { ok: false, reason: 'it does not sign the event just before it' };
  }
  const key = keys.get(signed.kid);
  if (!key) return { ok: false, reason: `key ${signed.kid} is not in /v1/keys` };
  const message = new TextEncoder().encode(jcs({ chain: 'sealgate-audit/v1', seq: signed.seq, hash: signed.hash }));
  let valid = false;
  try { valid = await crypto.subtle.verify({ name: 'Ed25519' }, key, unb64url(signed.sig), message); } catch { valid = false; }
  return valid ? { ok: true } : { ok: false, reason: 'the signature does not verify' };
}

// Verifies an export (JSON lines, oldest first), and with `keys` every checkpoint in it:
// {ok, events, checkpoints, unsigned} or {ok: false, seq, reason}.
export async function verifyExport(text, keys) {
  if (!globalThis.crypto || !crypto.subtle) {
    return { ok: false, reason: 'this page is not a secure context (HTTPS or localhost), so the browser cannot hash; use `sealgate audit verify` on the export' };
  }
  let previous = null;
  let events = 0;
  let checkpoints = 0;
  let unsigned = 0;
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    let event;
    try { event = JSON.parse(line); } catch { return { ok: false, seq: null, reason: `line ${events + 1} is not JSON` }; }
    const { hash, ...rest } = event;
    if (previous !== null && event.prev_hash !== previous) return { ok: false, seq: event.seq, reason: 'prev_hash does not match the event before it' };
    if (await sha256Hex(jcs(rest)) !== hash) return { ok: false, seq: event.seq, reason: 'hash does not match the event' };
    unsigned += 1;
    if (keys && event.type === 'AuditCheckpoint') {
      const check = await verifyCheckpoint(event, keys);
      if (!check.ok) return { ok: false, seq: event.seq, reason: `checkpoint: ${check.reason}` };
      checkpoints += 1;
      unsigned = 0;
    }
    previous = hash;
    events += 1;
  }
  return { ok: true, events, checkpoints, unsigned };
}
