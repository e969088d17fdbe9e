"""An MCP host made of the official MCP Python SDK (`mcp`, pinned in scripts/test.sh) that reaches a remote MCP
server over Streamable HTTP and signs its person in with the SDK's own OAuth client
(`mcp.client.auth.OAuthClientProvider`), for tests/mcp_oauth.rs (driven by tests/common/mcp_hosts.rs).

The SDK does the whole dance: the 401 and its `resource_metadata`, the protected resource metadata, the
authorization server's metadata, dynamic client registration, the authorization request with PKCE and
`resource`, the token request. The one step a person does (in a browser) is left to the test: this host
prints `AUTHORIZE <url>` and reads the redirect URL that the browser reached, as one line on stdin.

argv[1] is the plan (JSON): {"url": MCP URL, "redirect_uri": ..., "actions": [...]}, each action
{"method": "tools/list"} or {"method": "tools/call", "name": ..., "arguments": {...}}. Each result is printed
as one JSON line, {"method": ..., "result": RESULT} or {"method": ..., "error": {"code", "message", "data"}}.
"""

import asyncio
import json
import sys
from urllib.parse import parse_qs, urlparse

import anyio
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken


class Memory:
    """Token storage for one run: nothing outlives the process."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


async def send_to_browser(url: str) -> None:
    print(f"AUTHORIZE {url}", flush=True)


async def read_redirect() -> AuthorizationCodeResult:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    query = parse_qs(urlparse(line.strip()).query)
    if "code" not in query:
        raise RuntimeError(f"the authorization failed: {line.strip()}")
    first = lambda name: query.get(name, [None])[0]  # noqa: E731
    return AuthorizationCodeResult(code=first("code"), state=first("state"), iss=first("iss"))


def dump(model) -> dict:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def run(session: ClientSession, action: dict) -> dict:
    method = action["method"]
    try:
        if method == "tools/list":
            return {"method": method, "result": dump(await session.list_tools())}
        if method == "tools/call":
            result = await session.call_tool(action["name"], action.get("arguments", {}))
            return {"method": method, "result": dump(result)}
        raise ValueError(f"unknown action {method}")
    except Exception as error:  # an MCP error answer is a result to report, not a crash
        data = getattr(error, "error", None)
        if data is not None:
            return {"method": method, "error": dump(data)}
        return {"method": method, "error": {"message": repr(error)}}


async def main() -> None:
    plan = json.loads(sys.argv[1])
    auth = OAuthClientProvider(
        server_url=plan["url"],
        client_metadata=OAuthClientMetadata(
            client_name="sealgate-python-host",
            redirect_uris=[plan["redirect_uri"]],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=Memory(),
        redirect_handler=send_to_browser,
        callback_handler=read_redirect,
    )
    async with create_mcp_http_client(auth=auth) as http:
        async with streamable_http_client(plan["url"], http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                for action in plan["actions"]:
                    emit(await run(session, action))


asyncio.run(main())
