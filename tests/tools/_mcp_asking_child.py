"""A child process for the crash test: a session whose MCP server asks the user a
question nobody answers, so the parent can SIGKILL it while the call waits."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from lodger.events import ProposedCall
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import FunctionModel
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools.mcp import McpServerConfig
from lodger.tools.spec import Elicitation, ElicitationReply

ASKING = Path(__file__).parent.parent / "mcp_servers" / "asking_server.py"


def model(request: ModelRequest) -> ModelResponse:
    if len(request.messages) == 1:
        query = json.dumps({"query": "select:ask__sign_in"})
        return ModelResponse(
            calls=(ProposedCall(call_id="find", name="tool_search", arguments=query),)
        )
    if len(request.messages) == 3:
        return ModelResponse(
            calls=(ProposedCall(call_id="ask", name="ask__sign_in", arguments="{}"),)
        )
    return ModelResponse(text="done")


async def never(question: Elicitation) -> ElicitationReply:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def main(state: str) -> None:
    server = McpServerConfig(name="ask", command=sys.executable, args=(str(ASKING),))
    binding = Binding(model=FunctionModel(model), mcp=[server], elicitor=never)
    async with Sessions(Storage.local(state)) as sessions:
        await sessions.run("sign in", binding=binding, session="s")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
