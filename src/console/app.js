// The console's shell: sign-in (with the identity provider, or a pasted operator token), the token from
// a `#token=` link, and hash routing between the pages.

import {
  api, ApiFailure, el, errorText, field, forgetPerson, loadPerson, may, person, replace, say, token,
} from './lib.js';
import { pages, readScopes } from './pages.js';

const main = document.getElementById('main');
const signOut = document.getElementById('sign-out');
const who = document.getElementById('who');
let leave = () => {};

// `sealgate demo` prints /console/#token=…: the token is taken out of the address bar and the history
// at once. It is kept in session storage, unless another token is signed in already: then it replaces
// that one only when the operator says so (a link must not swap who acts without being noticed).
function takeLinkToken() {
  const match = /^#token=([^&]+)/.exec(window.location.hash);
  if (!match) return null;
  window.history.replaceState(null, '', `${window.location.pathname}#/overview`);
  return decodeURIComponent(match[1]);
}

function askToReplace(offered) {
  signOut.hidden = false;
  const keep = el('button', { type: 'button', on: { click: () => route() } }, 'Keep my current token');
  const use = el('button', { type: 'button', on: { click: () => { token.set(offered); route(); } } }, 'Use the link’s token');
  replace(main,
    el('h1', {}, 'Replace your token?'),
    el('p', {}, 'You are signed in, and the link you opened carries another operator token. '
      + 'Using it changes who you act as, and what you may do, from now on in this tab.'),
    el('div', { class: 'actions' }, keep, use));
  keep.focus();
}

// Who is signed in, their teams and scopes, beside the sign-out button.
function showPerson() {
  const current = person.current;
  who.hidden = !current;
  if (!current) { who.replaceChildren(); return; }
  const teams = Object.entries(current.scopes).map(([team, scopes]) => el('li', {},
    el('strong', {}, team === '*' ? 'every team' : `team ${team}`), `: ${scopes.join(', ')}`));
  who.replaceChildren(
    el('span', { 'data-testid': 'signed-in-as' }, `Signed in as ${current.name || current.sub} (${current.sub})`),
    teams.length ? el('ul', { 'data-testid': 'signed-in-scopes' }, ...teams)
      : el('span', { class: 'bad' }, ' — no role: you may read and do nothing here'));
}

// A `#token=` link opened in this tab, on load or later.
async function start() {
  await loadPerson().catch(() => null);
  showPerson();
  const offered = takeLinkToken();
  const current = token.get();
  if (offered && current && offered !== current) { askToReplace(offered); return; }
  if (offered) token.set(offered);
  route();
}

function signInPage() {
  const input = el('input', { type: 'password', autocomplete: 'off', spellcheck: 'false', size: 60, required: true });
  const problem = el('p', { class: 'bad', role: 'alert' });
  const form = el('form', { on: { submit: async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) { problem.textContent = 'Paste an operator token first.'; return; }
    token.set(value);
    try {
      // Any control call authenticates first: 401 means the token itself is refused; 403 only that
      // this listing is outside its scopes, which the pages then say where it matters.
      await api('GET', '/v1/seal/sessions?limit=1');
    } catch (error) {
      if (error instanceof ApiFailure && error.status === 401) {
        token.clear();
        problem.textContent = `Token refused: ${errorText(error)}`;
        return;
      }
    }
    window.location.hash = '#/overview';
    route();
  } } },
  ...field('Operator token (a JWT; kept in this tab only, never in a cookie)', input),
  el('div', { class: 'actions' }, el('button', { type: 'submit' }, 'Sign in')),
  problem);
  const provider = el('p', {}, el('a', { href: '/console/login', 'data-testid': 'provider-sign-in' },
    'Sign in with your organisation’s identity provider'));
  replace(main, el('h1', {}, 'Sign in'), provider,
    el('p', {}, 'Or, with an operator token:'), form);
  input.focus();
}

function route() {
  leave();
  leave = () => {};
  say('');
  const signedIn = Boolean(person.current || token.get());
  signOut.hidden = !signedIn;
  const name = (window.location.hash.match(/^#\/([a-z]+)/) || [])[1] || 'overview';
  for (const link of document.querySelectorAll('nav a')) {
    const target = link.getAttribute('href').slice(2);
    if (target === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
    // Only the pages the caller may read on some team: a payments approver sees no empty Claims page.
    link.parentElement.hidden = signedIn && Boolean(readScopes[target]) && !may(readScopes[target]);
  }
  if (!signedIn) { signInPage(); return; }
  const page = pages[name] || pages.overview;
  main.replaceChildren();
  leave = page(main) || (() => {});
}

signOut.addEventListener('click', async () => {
  if (person.current) {
    await api('POST', '/console/logout').catch((error) => say(errorText(error)));
    forgetPerson();
    showPerson();
  }
  token.clear();
  window.location.hash = '#/overview';
  route();
});
// A page chosen from the navigation takes the focus, so keyboard and screen-reader users land on it.
window.addEventListener('hashchange', () => {
  if (window.location.hash.startsWith('#token=') || window.location.hash === '#signed-in') { start(); return; }
  route();
  if (person.current || token.get()) main.focus({ preventScroll: true });
});
window.addEventListener('unhandledrejection', (event) => say(errorText(event.reason)));
start();
