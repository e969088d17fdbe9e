// An MCP host made of the official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json),
// for tests/connect.rs: the same plan and output as client.py, over stdio.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const plan = JSON.parse(process.argv[2]);
const [command, ...args] = plan.command;
const transport = new StdioClientTransport({ command, args, env: plan.env, stderr: "inherit" });
const client = new Client({ name: "sealgate-connect-test", version: "1.0.0" });
await client.connect(transport);

const seen = { progress: [] };
seen.initialize = {
  serverInfo: client.getServerVersion(),
  capabilities: client.getServerCapabilities(),
};
seen.tools = (await client.listTools()).tools.map((tool) => tool.name);
seen.allowed = await client.callTool({ name: plan.allowed.name, arguments: plan.allowed.arguments });
seen.refused = await client.callTool({ name: plan.refused.name, arguments: plan.refused.arguments });
seen.keyed = [];
for (let i = 0; i < 2; i++) {
  seen.keyed.push(
    await client.callTool({
      name: plan.keyed.name,
      arguments: plan.keyed.arguments,
      _meta: { idempotency_key: plan.keyed.key },
    }),
  );
}
seen.gated = await client.callTool({ name: plan.gated.name, arguments: plan.gated.arguments }, undefined, {
  timeout: 120000,
  onprogress: (progress) => seen.progress.push(progress),
});
await client.close();
console.log(JSON.stringify(seen));
