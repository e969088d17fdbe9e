// An MCP host made of the official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json)
// that reaches a remote MCP server over Streamable HTTP with an OAuthClientProvider, for tests/mcp_oauth.rs
// (driven by tests/common/mcp_hosts.rs). The SDK's `auth()` does the dance: the 401 and its
// `resource_metadata`, the protected resource metadata, the authorization server's metadata, dynamic
// client registration, the authorization URL with PKCE and `resource`, and (in `finishAuth`) the token
// request. This file only keeps what the SDK asks it to keep, and hands the person's step to the test:
// it prints `AUTHORIZE <url>` and reads the redirect URL the browser reached as one line on stdin.
//
// argv[2] is the plan, as for python_host.py: {"url", "redirect_uri", "actions": [...]}; one JSON line per
// action result.
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const plan = JSON.parse(process.argv[2]);
const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// What a host keeps between the steps of the dance, in memory for this run.
class MemoryAuth {
  constructor() {
    this.expectedState = randomBytes(16).toString('hex');
  }

  get redirectUrl() {
    return plan.redirect_uri;
  }

  get clientMetadata() {
    return {
      client_name: 'sealgate-typescript-host',
      redirect_uris: [plan.redirect_uri],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }

  state() {
    return this.expectedState;
  }

  clientInformation() {
    return this.client;
  }

  saveClientInformation(client) {
    this.client = client;
  }

  tokens() {
    return this.savedTokens;
  }

  saveTokens(tokens) {
    this.savedTokens = tokens;
  }

  redirectToAuthorization(url) {
    console.log(`AUTHORIZE ${url}`);
  }

  saveCodeVerifier(verifier) {
    this.verifier = verifier;
  }

  codeVerifier() {
    return this.verifier;
  }
}

const authProvider = new MemoryAuth();
const client = new Client({ name: 'sealgate-typescript-host', version: '1.0.0' });
const firstTry = new StreamableHTTPClientTransport(new URL(plan.url), { authProvider });
try {
  await client.connect(firstTry);
} catch (error) {
  if (!(error instanceof UnauthorizedError)) throw error;
  // The SDK sent the person to the authorization URL; the redirect comes back on stdin.
  const { value: line } = await stdin.next();
  const redirect = new URL(line.trim());
  const code = redirect.searchParams.get('code');
  if (!code) throw new Error(`the authorization failed: ${line}`);
  // The SDK leaves the state check to the host.
  if (redirect.searchParams.get('state') !== authProvider.expectedState) throw new Error(`state mismatch: ${line}`);
  // The transport that met the 401 knows its resource_metadata; the SDK's examples then connect anew.
  await firstTry.finishAuth(code);
  await client.connect(new StreamableHTTPClientTransport(new URL(plan.url), { authProvider }));
}

for (const action of plan.actions) {
  let line;
  try {
    if (action.method === 'tools/list') {
      line = { method: action.method, result: await client.listTools() };
    } else if (action.method === 'tools/call') {
      line = { method: action.method, result: await client.callTool({ name: action.name, arguments: action.arguments ?? {} }) };
    } else {
      throw new Error(`unknown action ${action.method}`);
    }
  } catch (error) {
    // An MCP error answer is a result to report (McpError carries code and data).
    line = { method: action.method, error: { code: error.code, message: error.message, data: error.data } };
  }
  console.log(JSON.stringify(line));
}
await client.close();
process.exit(0);
