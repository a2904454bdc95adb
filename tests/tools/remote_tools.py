"""Tools over the loopback server of ``idempotent_server``: ``pay`` (an idempotent
charge sent with the call's ``Idempotency-Key``) and ``build`` (a long-running job: the
server accepts it and answers a handle; ``poll`` reads the job's state)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from lodger.tools import Accepted, CannotTell, StillRunning, Tool, ToolContext, tool
from lodger.tools.http import http_request


def pay_tool(base: str, *, hang_after_effect: bool = False) -> Tool:
    @tool(recovery="idempotent")
    async def pay(amount: int, ctx: ToolContext) -> str:
        """Charge a card through the payments API."""
        response = await http_request(ctx, "POST", f"{base}/charges", json={"amount": amount})
        if hang_after_effect:  # the remote has the charge; the crash comes before T2
            await asyncio.Event().wait()
        return response.text()

    return pay


def build_tool(
    base: str, wait: Literal["continue", "wait"] = "continue", timeout: float = 20
) -> Tool:
    async def poll(handle: dict[str, Any], ctx: ToolContext) -> Any:
        response = await http_request(ctx, "GET", f"{base}/jobs/{handle['job']}")
        if response.status == 404:
            return CannotTell(reason=f"the server does not know job {handle['job']}")
        answer = response.json()
        if answer["state"] == "running":
            return StillRunning()
        return f"build finished: {answer['result']}"

    @tool(poll=poll, timeout=timeout)
    async def build(target: str, ctx: ToolContext) -> Accepted:
        """Start a build on the build farm."""
        response = await http_request(ctx, "POST", f"{base}/jobs", json={"target": target})
        return Accepted(handle={"job": response.json()["job"]}, wait=wait)

    return build


@tool
def note(text: str) -> str:
    """Write a note (does nothing else)."""
    return f"noted: {text}"
