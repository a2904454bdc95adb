"""An MCP server (official SDK, low-level ``Server``, stdio) that advertises hostile schemas.

    python broken_schemas_server.py

Its tools are what a careless or hostile server may list: ``dangling`` has a ``$ref`` to a
definition that does not exist, ``remote`` one to a URL (never fetched), ``nonsense`` an
input schema that is not a JSON schema at all, and ``fine`` a usable one so a test can see
that the good tools of the same server still work. Every call answers with the name of the
tool and its arguments, so a test can tell whether a call reached the server.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

SCHEMAS: dict[str, dict[str, Any]] = {
    "dangling": {
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/Missing"}},
        "required": ["item"],
    },
    "remote": {
        "type": "object",
        "properties": {"item": {"$ref": "https://schemas.invalid/item.json"}},
    },
    "nonsense": {"type": "object", "properties": {"x": {"type": "frobnicate"}}, "required": 5},
    "fine": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name=name, description=f"the {name} tool", input_schema=schema)
            for name, schema in SCHEMAS.items()
        ]
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = json.dumps({"tool": params.name, "arguments": params.arguments}, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("broken", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
