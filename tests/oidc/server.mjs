// A real OpenID provider for the tests (tests/common/oidc.rs starts it): the certified `oidc-provider`
// package, on 127.0.0.1 and a port the system picks, with the clients and users the test hands it in the
// environment variable OIDC_SETUP (JSON):
//   {"clients": [{"client_id", "client_secret"?, "redirect_uris": [...]}],
//    "users": [{"sub", "password", "name"?, "email"?, "groups": [...]}],
//    "groups_in_id_token": true,   // false: the groups claim only from the userinfo endpoint
//    "resource_scopes": ["mcp:tools"],   // optional: RFC 8707 resource indicators, see below
//    "registration": true,               // optional: RFC 7591 dynamic client registration, open to all
//    "signing_key_pem": "-----BEGIN PRIVATE KEY-----…"}  // optional: the RSA key it signs with
// It prints its issuer URL on one stdout line once it listens. The login and consent pages are small
// HTML forms of its own, so that a password is really checked (the package's development pages take
// any login); the device flow (RFC 8628) is enabled.
// With `resource_scopes`, it is also the authorization server of MCP hosts (tests/mcp_oauth.rs): a
// `resource` that is an http://127.0.0.1:* URL gets JWT access tokens whose `aud` is that resource, whose
// `scope` holds what was granted of `resource_scopes`, with the person's `groups` and `email`. A request
// without `resource` gets what it got before (no default resource is chosen for it).
import { createServer } from 'node:http';
import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import Provider, { errors } from 'oidc-provider';

const setup = JSON.parse(process.env.OIDC_SETUP ?? '{}');
const users = new Map((setup.users ?? []).map((user) => [user.sub, user]));
const groupsInIdToken = setup.groups_in_id_token ?? true;

// A key given by the test lets it forge tokens that the provider's published key verifies.
const privateKey = setup.signing_key_pem
  ? createPrivateKey(setup.signing_key_pem)
  : generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
const resourceScopes = setup.resource_scopes ?? null;
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', alg: 'RS256', use: 'sig' };

const clients = (setup.clients ?? []).map((client) => ({
  client_id: client.client_id,
  ...(client.client_secret
    ? { client_secret: client.client_secret, token_endpoint_auth_method: 'client_secret_basic' }
    : { token_endpoint_auth_method: 'none' }),
  redirect_uris: client.redirect_uris ?? [],
  grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
  response_types: ['code'],
}));

const server = createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients,
  jwks: { keys: [signingKey] },
  // `groups` rides on the openid scope so that every sign-in gets it, in the ID token unless the test
  // asks for it in userinfo only.
  claims: { openid: ['sub', 'groups'], profile: ['name'], email: ['email'] },
  conformIdTokenClaims: !groupsInIdToken,
  // Hosts register with the scope they will ask for (RFC 7591 `scope`), which must be one the provider
  // names.
  ...(resourceScopes ? { scopes: ['openid', 'offline_access', ...resourceScopes] } : {}),
  findAccount: (_ctx, sub) => {
    const user = users.get(sub);
    if (!user) return undefined;
    return {
      accountId: sub,
      claims: () => ({ sub, name: user.name, email: user.email, groups: user.groups ?? [] }),
    };
  },
  features: {
    devInteractions: { enabled: false },
    deviceFlow: { enabled: true },
    // Hosts register themselves as MCP hosts do (public clients with PKCE among them).
    registration: { enabled: Boolean(setup.registration) },
    resourceIndicators: {
      enabled: true,
      // Left as the package has it: no resource is chosen for a request that names none.
      defaultResource: async (_ctx, _client, oneOf) => oneOf,
      getResourceServerInfo: async (_ctx, resource) => {
        if (!resourceScopes || !/^http:\/\/127\.0\.0\.1:\d+(\/|$)/.test(resource)) {
          throw new errors.InvalidTarget();
        }
        return {
          scope: resourceScopes.join(' '),
          audience: resource,
          accessTokenFormat: 'jwt',
          accessTokenTTL: 600,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  // The people rules of the gateway read these from the access token, not from userinfo.
  extraTokenClaims: async (_ctx, token) => {
    if (!token.resourceServer) return undefined;
    const user = users.get(token.accountId);
    return user ? { groups: user.groups ?? [], email: user.email } : undefined;
  },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['sealgate-test-provider'] },
  ttl: { Session: 3600, Interaction: 600, Grant: 3600, IdToken: 600, AccessToken: 600, DeviceCode: 600, AuthorizationCode: 60 },
});
// Over plain http on loopback the provider must not insist on secure cookies.
provider.proxy = false;

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (title, body) => `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${escape(title)}</title>
<style>body{font-family:sans-serif;max-width:24em;margin:3em auto}input,button{display:block;margin:.5em 0;width:100%;font-size:1em}</style>
</head><body><h1>${escape(title)}</h1>${body}</body></html>`;

const readForm = async (req) => {
  let raw = '';
  for await (const chunk of req) raw += chunk;
  return Object.fromEntries(new URLSearchParams(raw));
};

// GET /interaction/UID shows the login form or the consent form; POST /interaction/UID/login checks the
// password; POST /interaction/UID/confirm grants what the client asked.
provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login|\/confirm)?$/);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const { uid, prompt, params } = details;
  if (ctx.method === 'GET') {
    ctx.type = 'html';
    ctx.body = prompt.name === 'login'
      ? page('Sign in', `<p>to ${escape(params.client_id)}</p>
<form method="post" action="/interaction/${uid}/login" id="login">
<input name="login" placeholder="user" autofocus><input name="password" type="password" placeholder="password">
<button type="submit">Sign in</button></form>${details.lastSubmission?.failed ? '<p id="error">Wrong user or password</p>' : ''}`)
      : page('Authorize', `<p>${escape(params.client_id)} asks for ${escape(params.scope)}</p>
<form method="post" action="/interaction/${uid}/confirm" id="consent"><button type="submit">Continue</button></form>`);
    return undefined;
  }
  const form = await readForm(ctx.req);
  if (match[2] === '/login') {
    const user = users.get(form.login);
    if (!user || user.password !== form.password) {
      ctx.type = 'html';
      ctx.status = 401;
      ctx.body = page('Sign in', `<p id="error">Wrong user or password</p>
<form method="post" action="/interaction/${uid}/login" id="login">
<input name="login"><input name="password" type="password"><button type="submit">Sign in</button></form>`);
      return undefined;
    }
    return provider.interactionFinished(ctx.req, ctx.res, { login: { accountId: user.sub } }, { mergeWithLastSubmission: false });
  }
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  for (const [indicator, scope] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scope.join(' '));
  }
  const grantId = await grant.save();
  return provider.interactionFinished(ctx.req, ctx.res, { consent: { grantId } }, { mergeWithLastSubmission: true });
});

server.on('request', provider.callback());
console.log(issuer);
