"""An MCP host made of the official MCP Python SDK (`mcp`, pinned in scripts/test.sh), for tests/connect.rs.

It connects to `sealgate connect` (over stdio, or Streamable HTTP), lists the tools, calls an allowed
tool, a refused one, a keyed tool twice and an approval-gated one, and prints what it saw as one JSON
object on stdout. The plan (argv[1]) is JSON: {"transport": "stdio", "command": [...], "env": {...}} or
{"transport": "http", "url": ...}, and the calls: "allowed", "refused", "keyed" (with "key"), "gated".
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def scenario(read, write, plan):
    seen = {"progress": []}

    async def on_progress(progress, total, message):
        seen["progress"].append({"progress": progress, "total": total, "message": message})

    async with ClientSession(read, write) as session:
        seen["initialize"] = dump(await session.initialize())
        seen["tools"] = [tool.name for tool in (await session.list_tools()).tools]
        call = plan["allowed"]
        seen["allowed"] = dump(await session.call_tool(call["name"], call["arguments"]))
        call = plan["refused"]
        seen["refused"] = dump(await session.call_tool(call["name"], call["arguments"]))
        call = plan["keyed"]
        seen["keyed"] = [
            dump(await session.call_tool(call["name"], call["arguments"], meta={"idempotency_key": call["key"]}))
            for _ in range(2)
        ]
        call = plan["gated"]
        seen["gated"] = dump(
            await session.call_tool(call["name"], call["arguments"], read_timeout_seconds=120, progress_callback=on_progress)
        )
    return seen


async def main():
    plan = json.loads(sys.argv[1])
    if plan["transport"] == "stdio":
        command, *args = plan["command"]
        server = StdioServerParameters(command=command, args=args, env=plan["env"])
        async with stdio_client(server) as streams:
            seen = await scenario(streams[0], streams[1], plan)
    else:
        async with streamable_http_client(plan["url"]) as streams:
            seen = await scenario(streams[0], streams[1], plan)
    print(json.dumps(seen))


asyncio.run(main())
