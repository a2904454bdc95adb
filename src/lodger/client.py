"""A Python client for the lodger HTTP host, with the host's verbs.

>>> async with HostClient("http://127.0.0.1:8470", token=TOKEN) as client:
...     session = await client.create_session()
...     sent = await client.send(session, "fix the test", key="fix-1")
...     async for fact in client.stream(session):
...         print(fact.offset, fact.kind)
...         if fact.kind == "turn_ended":
...             break

A refusal raises the ``LodgerError`` subclass its status names (``HostAuthError`` for
401/403, ``SessionNotFoundError``, ``HostConflictError`` for 409, ``UsageError`` for other
4xx, ``StorageError`` for 5xx) with the host's ``code``, ``hint`` and ``next_steps``; the
HTTP status is ``error.status``. ``stream`` reconnects after a dropped connection with
``Last-Event-ID`` and never yields an offset twice.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, cast, overload

from lodger._core.extras import require
from lodger.errors import (
    ActionName,
    HostAuthError,
    HostConflictError,
    LodgerError,
    NextStep,
    SessionNotFoundError,
    StorageError,
    UsageError,
)
from lodger.media import BinaryContent, MediaItem

with require("client", "the HTTP client of the lodger host (lodger.client)"):
    import httpx2

__all__ = ["HostClient", "StreamedDelta", "StreamedFact"]


@dataclass(frozen=True)
class StreamedFact:
    """One committed fact from a session's stream (``data`` is the event as JSON)."""

    offset: int
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class StreamedDelta:
    """A piece of the model's text as it streams (``HostClient.live``): transient,
    never a fact; its step's ``model_output`` fact holds the whole text."""

    turn_id: str
    step_id: str
    text: str


def _error(response: httpx2.Response) -> LodgerError:
    try:
        detail = response.json()["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        detail, code, message = {}, "usage", f"HTTP {response.status_code}: {response.text[:200]}"
    status = response.status_code
    cls: type[LodgerError]
    if status in (401, 403):
        cls = HostAuthError
    elif status == 404 and code == "session_not_found":
        cls = SessionNotFoundError
    elif status == 409:
        cls = HostConflictError
    elif status >= 500:
        cls = StorageError
    else:
        cls = UsageError
    steps = tuple(
        NextStep(
            action=cast(ActionName, s.get("action")),
            session_id=s.get("session_id"),
            call_id=s.get("call_id"),
        )
        for s in detail.get("next_steps", ())
    )
    error: LodgerError = cls(
        message,
        hint=detail.get("hint"),
        code=code,
        session_id=detail.get("session_id"),
        call_id=detail.get("call_id"),
        offset=detail.get("offset"),
        next_steps=steps,
    )
    error.status = status  # type: ignore[attr-defined]
    return error


class HostClient:
    """The host's verbs over HTTP (``httpx2.AsyncClient``; pass ``transport=`` to test
    against an app in-process)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        timeout: float = 30.0,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx2.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(timeout, read=None),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> HostClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _error(response)
        if response.status_code == 204 or not response.content:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    # ------------------------------------------------------------ sessions

    async def create_session(
        self,
        *,
        session_id: str | None = None,
        model: str | None = None,
        message: str | None = None,
        key: str | None = None,
    ) -> str:
        body = {
            "session_id": session_id,
            "model": model,
            "message": message,
            "idempotency_key": key,
        }
        made = await self._call(
            "POST", "/v1/sessions", json={k: v for k, v in body.items() if v is not None}
        )
        return str(made["session_id"])

    async def list_sessions(self) -> list[str]:
        return list((await self._call("GET", "/v1/sessions"))["sessions"])

    async def show(self, session_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/sessions/{session_id}"))

    async def replay_report(self, session_id: str) -> dict[str, Any]:
        """The report of a replay session against the session it replays (where the two
        trajectories diverge, calls added and removed, answers, tokens and cost)."""
        return dict(await self._call("GET", f"/v1/sessions/{session_id}/replay-report"))

    async def events(
        self, session_id: str, *, start: int = 0, limit: int = 1000
    ) -> list[StreamedFact]:
        page = await self._call(
            "GET", f"/v1/sessions/{session_id}/events", params={"start": start, "limit": limit}
        )
        return [StreamedFact(e["offset"], e["kind"], e) for e in page["events"]]

    async def send(
        self,
        session_id: str,
        text: str,
        *,
        key: str | None = None,
        attachments: Sequence[MediaItem] = (),
        model_settings: dict[str, Any] | None = None,
        resources: Sequence[tuple[str, str]] = (),
        prompt: tuple[str, str, dict[str, str]] | None = None,
        policy: str = "enqueue",
    ) -> dict[str, Any]:
        """Queue a turn (with images and documents: ``BinaryContent``, ``ImageUrl``,
        ``DocumentUrl``; asking the model with ``model_settings``, as lodger.toml's
        ``[model_settings]`` names them; with MCP ``resources`` as ``(server, uri)`` read
        into its input, starting from MCP ``prompt`` ``(server, name, arguments)``);
        returns ``{"message": {...}, "created": bool, "stream": path}``. ``policy`` says
        what to do while the session has work, as the follow-up queue's: ``enqueue``,
        ``reject`` (409 ``session_busy``), ``interrupt`` or ``rollback`` (stop the
        running turn, then run this first)."""
        body: dict[str, Any] = {"text": text}
        if resources:
            body["resources"] = [{"server": s, "uri": u} for s, u in resources]
        if prompt is not None:
            server, name, arguments = prompt
            body["prompt"] = {"server": server, "name": name, "arguments": arguments}
        if policy != "enqueue":
            body["policy"] = policy
        if key is not None:
            body["idempotency_key"] = key
        if attachments:
            body["attachments"] = [_attachment_body(a) for a in attachments]
        if model_settings is not None:
            body["model_settings"] = model_settings
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/messages", json=body))

    async def message(self, session_id: str, message_id: int) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/sessions/{session_id}/messages/{message_id}"))

    async def wait_message(
        self, session_id: str, message_id: int, *, within: float = 60.0, poll: float = 0.05
    ) -> dict[str, Any]:
        """Poll until the message is done or failed."""
        async with asyncio.timeout(within):
            while True:
                found = await self.message(session_id, message_id)
                if found["status"] in ("done", "failed"):
                    return found
                await asyncio.sleep(poll)

    # ------------------------------------------------------------ streams

    async def stream(
        self,
        session_id: str,
        *,
        after: int | None = None,
        follow: bool = True,
        reconnect: bool = True,
    ) -> AsyncIterator[StreamedFact]:
        """Facts from offset ``after + 1`` (from 0 when None), live; a dropped
        connection is resumed with ``Last-Event-ID``."""
        last = after
        while True:
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            try:
                async with self._http.stream(
                    "GET",
                    f"/v1/sessions/{session_id}/stream",
                    params={"follow": "true" if follow else "false"},
                    headers=headers,
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise _error(response)
                    async for fact in _parse_sse(response):
                        if last is not None and fact.offset <= last:
                            continue
                        last = fact.offset
                        yield fact
                    if not follow:
                        return
            except (httpx2.RemoteProtocolError, httpx2.ReadError) as exc:
                if not reconnect:
                    raise StorageError(
                        f"the stream of session {session_id!r} dropped: {exc}",
                        hint="reconnect with Last-Event-ID",
                        code="storage",
                    ) from exc
                await asyncio.sleep(0.05)

    async def live(
        self, session_id: str, *, after: int | None = None
    ) -> AsyncIterator[StreamedFact | StreamedDelta]:
        """As ``stream``, with the model's text deltas interleaved (``?deltas=true``);
        a dropped connection resumes after the last fact (deltas are not replayed)."""
        last = after
        while True:
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            try:
                async with self._http.stream(
                    "GET",
                    f"/v1/sessions/{session_id}/stream",
                    params={"deltas": "true"},
                    headers=headers,
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise _error(response)
                    async for item in _parse_sse(response, deltas=True):
                        if isinstance(item, StreamedFact):
                            if last is not None and item.offset <= last:
                                continue
                            last = item.offset
                        yield item
            except (httpx2.RemoteProtocolError, httpx2.ReadError):
                await asyncio.sleep(0.05)

    # ------------------------------------------------------------ approvals

    async def approvals(self, session_id: str | None = None) -> list[dict[str, Any]]:
        path = "/v1/approvals" if session_id is None else f"/v1/sessions/{session_id}/approvals"
        return list((await self._call("GET", path))["approvals"])

    async def answer(self, session_id: str, call_id: str, *, allow: bool) -> dict[str, Any]:
        return dict(
            await self._call(
                "POST",
                f"/v1/sessions/{session_id}/approvals/{call_id}",
                json={"decision": "allow" if allow else "deny"},
            )
        )

    # ------------------------------------------------------------ elicitations

    async def elicitations(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Open questions of MCP servers to a person (of one session, or of all)."""
        path = (
            "/v1/elicitations" if session_id is None else f"/v1/sessions/{session_id}/elicitations"
        )
        return list((await self._call("GET", path))["elicitations"])

    async def answer_elicitation(
        self,
        session_id: str,
        elicitation_id: str,
        *,
        action: str,
        content: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Answer an open question: ``accept`` (with the form's ``content``), ``decline``
        or ``cancel``; the first answer wins."""
        return dict(
            await self._call(
                "POST",
                f"/v1/sessions/{session_id}/elicitations/{elicitation_id}",
                json={"action": action, "content": content or {}},
            )
        )

    # ------------------------------------------------------------ recovery

    async def recovery(self, session_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/sessions/{session_id}/recovery"))

    async def decide(
        self, session_id: str, call_id: str, decision: str, *, result: str | None = None
    ) -> list[int]:
        body = {"call_id": call_id, "decision": decision, "result": result}
        made = await self._call("POST", f"/v1/sessions/{session_id}/decide", json=body)
        return list(made["offsets"])

    async def resume(self, session_id: str, *, key: str | None = None) -> dict[str, Any]:
        body = {} if key is None else {"idempotency_key": key}
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/resume", json=body))

    async def abandon(self, session_id: str, *, reason: str | None = None) -> list[int]:
        made = await self._call(
            "POST", f"/v1/sessions/{session_id}/abandon", json={"reason": reason}
        )
        return list(made["offsets"])

    async def cancel(self, session_id: str, *, reason: str = "") -> dict[str, Any]:
        """Cancel the session's running turn: ``status`` says what happened
        (``cancelled``, ``requested``, ``already_cancelling``, ``not_running``)."""
        return dict(
            await self._call("POST", f"/v1/sessions/{session_id}/cancel", json={"reason": reason})
        )

    async def set_permission_mode(self, session_id: str, mode: str) -> dict[str, Any]:
        """Switch the session's permission mode from its next step on."""
        return dict(
            await self._call("POST", f"/v1/sessions/{session_id}/mode", json={"mode": mode})
        )

    async def fork(
        self, session_id: str, *, at: int | None = None, new_id: str | None = None
    ) -> str:
        body = {"at": at, "session_id": new_id}
        made = await self._call(
            "POST",
            f"/v1/sessions/{session_id}/fork",
            json={k: v for k, v in body.items() if v is not None},
        )
        return str(made["session_id"])

    async def compact(self, session_id: str, *, instructions: str | None = None) -> dict[str, Any]:
        """Compact the session's context now: ``compacted`` (whether a summary was
        recorded), ``offset`` and ``fact`` (the ``compacted`` or ``compaction_failed`` fact)."""
        body = {} if instructions is None else {"instructions": instructions}
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/compact", json=body))

    async def artifact(self, session_id: str, sha256: str) -> bytes:
        data = await self._call("GET", f"/v1/sessions/{session_id}/artifacts/{sha256}")
        return data if isinstance(data, bytes) else json.dumps(data).encode()

    # ------------------------------------------------------------ operations

    async def make_token(self, *, session_id: str | None = None, label: str = "") -> str:
        body: dict[str, Any] = {"label": label}
        if session_id is not None:
            body["session_id"] = session_id
        return str((await self._call("POST", "/v1/tokens", json=body))["token"])

    async def revoke_token(self, token: str | None = None, *, id: str | None = None) -> bool:
        """Revoke a token for good: ``token`` itself (admin: any token; any token: itself)
        or, with an admin token, its ``id`` from ``list_tokens``."""
        body = {key: value for key, value in (("token", token), ("id", id)) if value is not None}
        return bool((await self._call("POST", "/v1/tokens/revoke", json=body))["revoked"])

    async def list_tokens(self) -> list[dict[str, Any]]:
        """Every token the host records (admin only), each by its public ``id``."""
        return list((await self._call("GET", "/v1/tokens"))["tokens"])

    async def metrics(self) -> str:
        data = await self._call("GET", "/metrics")
        return data.decode() if isinstance(data, bytes) else str(data)

    async def steer(self, session_id: str, text: str) -> dict[str, Any]:
        """Send the running turn a message (``{"steer_id", "status", "offset"}``;
        ``status`` ``queued`` when no turn was running: it is the next turn)."""
        path = f"/v1/sessions/{session_id}/steer"
        return dict(await self._call("POST", path, json={"text": text}))

    async def queue(self, session_id: str) -> dict[str, Any]:
        """The follow-up queue: ``{"session_id", "busy", "messages": [...]}``."""
        return dict(await self._call("GET", f"/v1/sessions/{session_id}/queue"))

    async def follow_up(
        self, session_id: str, text: str, *, policy: str = "enqueue"
    ) -> dict[str, Any]:
        """Queue a follow-up message with its policy (enqueue, reject, interrupt, rollback)."""
        body = {"text": text, "policy": policy}
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/queue", json=body))

    async def change_queued(
        self,
        session_id: str,
        message_id: str,
        *,
        text: str | None = None,
        position: int | None = None,
    ) -> dict[str, Any]:
        """Edit and/or move a queued message; the queue after it."""
        body: dict[str, Any] = {}
        if text is not None:
            body["text"] = text
        if position is not None:
            body["position"] = position
        path = f"/v1/sessions/{session_id}/queue/{message_id}"
        return dict(await self._call("PATCH", path, json=body))

    async def retract_queued(self, session_id: str, message_id: str) -> dict[str, Any]:
        """Take a message out of the queue before it is delivered; the queue after it."""
        path = f"/v1/sessions/{session_id}/queue/{message_id}"
        return dict(await self._call("DELETE", path))

    async def rewind(
        self,
        session_id: str,
        *,
        to: int | None = None,
        turn: int | None = None,
        branch: str | None = None,
        undo: bool = False,
        force: bool = False,
    ) -> dict[str, Any]:
        """Rewind the session, conversation and workspace files; the answer names its
        new current ``branch`` (see ``lodger.runtime.rewind``)."""
        point: dict[str, Any]
        if undo:
            point = {"kind": "undo"}
        elif to is not None:
            point = {"kind": "offset", "offset": to, "branch": branch}
        elif turn is not None:
            point = {"kind": "turn", "turn": turn, "branch": branch}
        else:
            point = {"kind": "branch", "branch": branch}
        body = {"point": point, "force": force}
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/rewind", json=body))


def _attachment_body(item: MediaItem) -> dict[str, str]:
    if isinstance(item, BinaryContent):
        data = base64.b64encode(item.data).decode("ascii")
        return {"media_type": item.media_type, "data": data, "name": item.name}
    out = {"url": item.url}
    if item.media_type:
        out["media_type"] = item.media_type
    return out


@overload
def _parse_sse(
    response: httpx2.Response, *, deltas: Literal[False] = False
) -> AsyncIterator[StreamedFact]: ...


@overload
def _parse_sse(
    response: httpx2.Response, *, deltas: Literal[True]
) -> AsyncIterator[StreamedFact | StreamedDelta]: ...


async def _parse_sse(
    response: httpx2.Response, *, deltas: bool = False
) -> AsyncIterator[StreamedFact | StreamedDelta]:
    event_id: str | None = None
    kind = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data and event_id is None and kind == "stream_error":  # the host ends it
                body = "\n".join(data).encode()
                raise _error(httpx2.Response(500, content=body))  # as if the route answered
            if deltas and data and event_id is None and kind == "text_delta":
                piece = json.loads("\n".join(data))
                yield StreamedDelta(piece["turn_id"], piece["step_id"], piece["text"])
            elif data and event_id is not None:
                yield StreamedFact(int(event_id), kind, json.loads("\n".join(data)))
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            event_id = value
        elif field == "event":
            kind = value
        elif field == "data":
            data.append(value)
