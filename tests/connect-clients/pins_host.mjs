// An MCP host made of the official MCP TypeScript SDK, driven line by line, for tests/tool_pins.rs: the
// same commands and answers as pins_host.py (`list`, `call NAME`, `quit`), over stdio.
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const plan = JSON.parse(process.argv[2]);
const [command, ...args] = plan.command;
const transport = new StdioClientTransport({ command, args, env: plan.env, stderr: "inherit" });
const client = new Client({ name: "sealgate-pins-test", version: "1.0.0" });
await client.connect(transport);

for await (const raw of createInterface({ input: process.stdin })) {
  const line = raw.trim();
  if (line === "" || line === "quit") break;
  let answer;
  if (line === "list") {
    answer = (await client.listTools()).tools.map((tool) => tool.name);
  } else {
    answer = await client.callTool({ name: line.replace(/^call /, ""), arguments: { path: "/workspace/a" } });
  }
  console.log(JSON.stringify(answer));
}
await client.close();
