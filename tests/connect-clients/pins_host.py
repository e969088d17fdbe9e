"""An MCP host made of the official MCP Python SDK, driven line by line, for tests/tool_pins.rs: it connects
to `sealgate connect` over stdio (argv[1]: {"command": [...], "env": {...}}) and then reads commands on stdin,
answering each with one JSON line on stdout: `list` (the tool names), `call NAME` (the tool result), `quit`.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    plan = json.loads(sys.argv[1])
    command, *args = plan["command"]
    server = StdioServerParameters(command=command, args=args, env=plan["env"])
    loop = asyncio.get_running_loop()
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            while True:
                line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
                if line in ("", "quit"):
                    break
                if line == "list":
                    answer = [tool.name for tool in (await session.list_tools()).tools]
                else:
                    name = line.removeprefix("call ")
                    result = await session.call_tool(name, {"path": "/workspace/a"})
                    answer = result.model_dump(mode="json", by_alias=True, exclude_none=True)
                print(json.dumps(answer), flush=True)


asyncio.run(main())
