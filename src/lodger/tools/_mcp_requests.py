"""What an MCP server asks of lodger while its tools run: elicitation, sampling, roots.

A server's request is a fact of the call it came during: ``elicitation_requested`` and
``elicitation_answered``, ``sampling_requested`` and ``sampling_answered``, committed in
the call's envelope between its T1 and its T2 (``ToolContext.runtime``). A request is
the call's that is in flight on the server's connection (the oldest, when several are:
the protocol does not say which one asked over stdio); one that comes while no call of
the server runs is refused, with a log line, and leaves no fact (no call to tie it to).

- **Elicitation** (form or URL mode) goes to the run's ``Elicitor`` (the CLI's prompt,
  the host's inbox) unless the server's policy declines it (``elicitation = "decline"``)
  or nobody can answer in this run (a worker, a library run without an elicitor): then
  it is declined, ``by="policy"``. An answer that does not come within
  ``elicitation_timeout_s`` cancels it (``by="timeout"``). A form answer is checked
  against the requested schema (an invalid one is declined); the values of fields the
  schema marks sensitive (``writeOnly``, ``format: "password"``, ``x-sensitive``) go to
  the server and are withheld from the log (``withheld`` names them). A URL is shown to
  the person only: it is never put into what the model reads.
- **Sampling** is refused unless the server's policy allows it (``sampling =
  "allow"``); allowed, the session's own model answers (its usage counts in the
  session's budgets) at most ``max_samplings`` times per call: a server that asks in a
  loop is refused past that, and the refusal is a fact too.
- **Roots** are offered only when the server's policy allows it (``roots = true``): the
  workspace, as one ``file://`` root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lodger._core.text import visible_text
from lodger.events import (
    ElicitationAnswered,
    ElicitationRequested,
    SamplingAnswered,
    SamplingRequested,
    Usage,
)
from lodger.providers.base import AssistantMessage, ModelRequest, UserMessage
from lodger.tools.spec import Elicitation, ElicitationReply, ToolContext

if TYPE_CHECKING:
    import mcp_types
    from mcp.client.session import ClientRequestContext


__all__ = ["AskPolicy", "InFlight", "ServerRequests", "form_problems", "sensitive_fields"]

_log = logging.getLogger("lodger.tools.mcp")

#: the largest sampling request (canonical JSON) recorded whole; a longer one is refused
MAX_SAMPLING_REQUEST_BYTES = 64 * 1024


class AskPolicy(Protocol):
    """What of a server's config decides its requests (``McpServerConfig`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def elicitation(self) -> str: ...
    @property
    def elicitation_timeout_s(self) -> float: ...
    @property
    def sampling(self) -> str: ...
    @property
    def max_samplings(self) -> int: ...
    @property
    def sampling_max_tokens(self) -> int: ...


@dataclass(eq=False)
class _Slot:
    """One call in flight on the connection."""

    ctx: ToolContext
    elicitations: int = 0
    samplings: int = 0
    ended: bool = False
    pending: set[asyncio.Future[Any]] = field(default_factory=set)


class InFlight:
    """The calls in flight on one connection, oldest first."""

    def __init__(self) -> None:
        self._slots: list[_Slot] = []

    @contextlib.contextmanager
    def call(self, ctx: ToolContext) -> Iterator[_Slot]:
        slot = _Slot(ctx)
        self._slots.append(slot)
        try:
            yield slot
        finally:
            slot.ended = True  # nothing of this call is committed after its T2
            for waiting in slot.pending:
                waiting.cancel()
            self._slots.remove(slot)

    def current(self) -> _Slot | None:
        return self._slots[0] if self._slots else None


def sensitive_fields(schema: Mapping[str, Any]) -> set[str]:
    """The properties of an elicitation schema whose values stay out of the log."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return set()
    out = set()
    for name, spec in properties.items():
        if isinstance(spec, dict) and (
            spec.get("writeOnly") is True
            or spec.get("format") == "password"
            or spec.get("x-sensitive") is True
            or spec.get("sensitive") is True
        ):
            out.add(str(name))
    return out


def form_problems(schema: Mapping[str, Any], content: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``content`` as an answer to a form of ``schema`` (empty: fine)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        validator = Draft202012Validator(
            dict(schema), format_checker=Draft202012Validator.FORMAT_CHECKER
        )
        errors = sorted(validator.iter_errors(dict(content)), key=lambda e: list(e.path))
    except SchemaError as exc:
        return [f"the server's schema is not valid ({exc.message})"]
    return [
        f"{'/'.join(map(str, e.path)) or 'the answer'}: {visible_text(e.message)[:200]}"
        for e in errors[:5]
    ]


class ServerRequests:
    """Answers one server's requests (the SDK's callbacks for its ``Client``)."""

    def __init__(self, config: AskPolicy, inflight: InFlight, workspace: Path | None) -> None:
        self.config = config
        self.inflight = inflight
        self.workspace = workspace

    # ------------------------------------------------------------ elicitation

    async def elicit(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        import mcp_types

        slot = self.inflight.current()
        if slot is None or slot.ctx.runtime is None:
            _log.warning(
                "MCP server %r asked the user a question while none of its calls ran: declined",
                self.config.name,
            )
            return mcp_types.ElicitResult(action="decline")
        reply = await self.ask(slot, params)
        content = dict(reply.content) if reply.action == "accept" else None
        return mcp_types.ElicitResult(action=reply.action, content=content or None)

    async def ask(self, slot: _Slot, params: mcp_types.ElicitRequestParams) -> ElicitationReply:
        """Commit the question, get its answer (or the policy's), commit the answer."""
        import mcp_types

        runtime, ctx = slot.ctx.runtime, slot.ctx
        assert runtime is not None
        slot.elicitations += 1
        url = params.url if isinstance(params, mcp_types.ElicitRequestURLParams) else None
        schema: dict[str, Any] = {}
        if isinstance(params, mcp_types.ElicitRequestFormParams):
            schema = dict(params.requested_schema)
        question = Elicitation(
            elicitation_id=f"el-{ctx.operation_id}-{slot.elicitations}",
            session_id=ctx.session_id,
            call_id=ctx.call_id,
            server=self.config.name,
            mode="url" if url is not None else "form",
            message=visible_text(params.message)[:4000],
            requested_schema=schema,
            url=url,
        )
        await runtime.commit(
            ElicitationRequested(
                elicitation_id=question.elicitation_id,
                operation_id=ctx.operation_id,
                server=question.server,
                mode=question.mode,
                message=question.message,
                requested_schema=schema,
                url=url,
            )
        )
        reply, by = await self._answer(slot, question)
        if reply.action == "accept" and question.mode == "form":
            problems = form_problems(schema, reply.content)
            if problems:
                _log.warning(
                    "the answer to %s does not match its form (%s): declined",
                    question.elicitation_id,
                    "; ".join(problems),
                )
                reply, by = ElicitationReply(action="decline", who=reply.who), "policy"
        if slot.ended:
            return ElicitationReply(action="cancel")  # the call ended meanwhile
        secret = sensitive_fields(schema)
        content = dict(reply.content) if reply.action == "accept" else {}
        await runtime.commit(
            ElicitationAnswered(
                elicitation_id=question.elicitation_id,
                action=reply.action,
                content={k: v for k, v in content.items() if k not in secret},
                withheld=tuple(sorted(k for k in content if k in secret)),
                by=by,
                who=reply.who,
            )
        )
        return ElicitationReply(action=reply.action, content=content, who=reply.who)

    async def _answer(self, slot: _Slot, question: Elicitation) -> tuple[ElicitationReply, Any]:
        runtime = slot.ctx.runtime
        assert runtime is not None
        elicitor = runtime.elicitor
        if self.config.elicitation == "decline" or elicitor is None:
            return ElicitationReply(action="decline"), "policy"
        waiting = asyncio.ensure_future(elicitor(question))
        slot.pending.add(waiting)
        try:
            async with asyncio.timeout(self.config.elicitation_timeout_s):
                reply = await waiting
        except TimeoutError:
            return ElicitationReply(action="cancel"), "timeout"
        except asyncio.CancelledError:
            if not slot.ended:
                raise
            return ElicitationReply(action="cancel"), "timeout"
        finally:
            slot.pending.discard(waiting)
            waiting.cancel()
        by = "operator" if (reply.who or "").startswith("token:") else "user"
        return reply, by

    # ------------------------------------------------------------ sampling

    async def sample(
        self, context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        import mcp_types

        slot = self.inflight.current()
        if slot is None or slot.ctx.runtime is None:
            _log.warning(
                "MCP server %r asked for a model completion while none of its calls ran: refused",
                self.config.name,
            )
            return mcp_types.ErrorData(
                code=mcp_types.INVALID_REQUEST, message="sampling is refused outside a tool call"
            )
        runtime, ctx = slot.ctx.runtime, slot.ctx
        slot.samplings += 1
        sampling_id = f"sm-{ctx.operation_id}-{slot.samplings}"
        request = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        reason = self._refusal(slot, request)
        if reason is not None and len(json.dumps(request)) > MAX_SAMPLING_REQUEST_BYTES:
            request = {"omitted": f"{len(json.dumps(request))} bytes of JSON"}
        await runtime.commit(
            SamplingRequested(
                sampling_id=sampling_id,
                operation_id=ctx.operation_id,
                server=self.config.name,
                request=request,
                decision="deny" if reason is not None else "allow",
                reason=reason or "",
            )
        )
        if reason is not None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=reason)
        response = await runtime.sample(self._model_request(params))
        usage = response.usage or Usage()
        if not slot.ended:
            await runtime.commit(
                SamplingAnswered(
                    sampling_id=sampling_id,
                    model=runtime.model_spec,
                    content=response.text,
                    stop_reason=response.finish_reason,
                    usage=usage,
                )
            )
        return mcp_types.CreateMessageResult(
            role="assistant",
            content=mcp_types.TextContent(type="text", text=response.text),
            model=runtime.model_spec,
            stop_reason="maxTokens" if response.finish_reason == "length" else "endTurn",
        )

    def _refusal(self, slot: _Slot, request: Mapping[str, Any]) -> str | None:
        c = self.config
        if c.sampling != "allow":
            return (
                f"sampling is refused by lodger's policy for MCP server {c.name!r} "
                '(sampling = "allow" in its [mcp.servers] table allows it)'
            )
        if slot.samplings > c.max_samplings:
            return (
                f"MCP server {c.name!r} asked for more than {c.max_samplings} completions "
                "in one call; lodger refuses the rest of them (max_samplings)"
            )
        if len(json.dumps(request)) > MAX_SAMPLING_REQUEST_BYTES:
            return f"the request is larger than {MAX_SAMPLING_REQUEST_BYTES} bytes"
        return None

    def _model_request(self, params: mcp_types.CreateMessageRequestParams) -> ModelRequest:
        messages: list[UserMessage | AssistantMessage] = []
        for message in params.messages:
            blocks = message.content if isinstance(message.content, list) else [message.content]
            text = "\n".join(
                str(getattr(b, "text", f"[{getattr(b, 'type', 'content')} not shown]"))
                for b in blocks
            )
            if message.role == "assistant":
                messages.append(AssistantMessage(text=text))
            else:
                messages.append(UserMessage(text=text, source="runtime"))
        limit = min(params.max_tokens, self.config.sampling_max_tokens)
        return ModelRequest(
            system=params.system_prompt or "", messages=messages, max_output_tokens=limit
        )

    # ------------------------------------------------------------ roots

    async def roots(
        self, context: ClientRequestContext
    ) -> mcp_types.ListRootsResult | mcp_types.ErrorData:
        import mcp_types

        slot = self.inflight.current()
        workspace = slot.ctx.workspace if slot is not None and slot.ctx.workspace else None
        workspace = workspace or self.workspace
        if workspace is None:
            return mcp_types.ListRootsResult(roots=[])
        uri = await asyncio.to_thread(lambda: Path(workspace).resolve().as_uri())
        root = mcp_types.Root(uri=uri, name="workspace")
        return mcp_types.ListRootsResult(roots=[root])
