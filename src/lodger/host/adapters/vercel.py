"""The Vercel AI SDK's UI message stream (protocol ``v1``, AI SDK 5 and 6): what
``useChat``, ``DefaultChatTransport`` and ``readUIMessageStream`` read.

Server-sent events whose ``data`` is one JSON chunk each, ending with ``data: [DONE]``;
the response carries ``x-vercel-ai-ui-message-stream: v1``. One turn is one assistant
message, whose id is the turn's id:

- ``start`` (``messageId``, ``messageMetadata.lodger``: session and turn), then per step
  ``start-step`` ... ``finish-step``;
- the step's text: ``text-start`` / ``text-delta`` / ``text-end`` (deltas while the model
  writes, the rest of the committed text when its ``model_output`` commits); reasoning as
  ``reasoning-start`` / ``reasoning-delta`` / ``reasoning-end``;
- a call: ``tool-input-available`` (``tool-input-error`` for arguments that are not a
  JSON object), then ``tool-output-available``, ``tool-output-error`` or
  ``tool-output-denied``; a call waiting for a person: ``tool-approval-request`` whose
  ``approvalId`` is the call's id (answer it with ``addToolApprovalResponse``, or the
  host's approvals API);
- ``error`` (a failed turn: its error), then ``finish`` (``finishReason``;
  ``messageMetadata.lodger``: ``status``, ``next_offset``, ``error``).
"""

from __future__ import annotations

import json
from typing import Any

from lodger.host.adapters.turn import (
    ApprovalAsked,
    Began,
    CallDenied,
    CallFailed,
    CallProposed,
    CallResult,
    Ended,
    Move,
    Reasoning,
    StepBegan,
    Text,
    TextDone,
)

__all__ = ["HEADERS", "UIMessageChunks", "sse_chunk", "sse_done"]

#: the response headers of a UI message stream
HEADERS = {
    "x-vercel-ai-ui-message-stream": "v1",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

#: a turn's end as the SDK's finish reason
_FINISH_REASONS = {
    "completed": "stop",
    "failed": "error",
    "step_limit": "length",
    "waiting_for_approval": "tool-calls",
}


def sse_chunk(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


def sse_done() -> bytes:
    return b"data: [DONE]\n\n"


class UIMessageChunks:
    """Encodes one turn's moves as UI message chunks."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.turn_id: str | None = None
        self._step_open = False
        self._text_open: set[str] = set()

    def chunks(self, move: Move) -> list[dict[str, Any]]:
        if isinstance(move, Began):
            self.turn_id = move.turn_id
            meta = {"lodger": {"session_id": self.session_id, "turn_id": move.turn_id}}
            return [{"type": "start", "messageId": move.turn_id, "messageMetadata": meta}]
        if isinstance(move, StepBegan):
            out = self._finish_step()
            self._step_open = True
            return [*out, {"type": "start-step"}]
        if isinstance(move, Text):
            return self._text(move)
        if isinstance(move, TextDone):
            if move.part_id not in self._text_open:
                return []
            self._text_open.discard(move.part_id)
            return [{"type": "text-end", "id": move.part_id}]
        if isinstance(move, Reasoning):
            part = move.part_id
            return [
                {"type": "reasoning-start", "id": part},
                {"type": "reasoning-delta", "id": part, "delta": move.text},
                {"type": "reasoning-end", "id": part},
            ]
        if isinstance(move, Ended):
            return self._ended(move)
        return self._call(move)

    def _text(self, move: Text) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if move.part_id not in self._text_open:
            self._text_open.add(move.part_id)
            out.append({"type": "text-start", "id": move.part_id})
        out.append({"type": "text-delta", "id": move.part_id, "delta": move.text})
        return out

    def _call(self, move: Move) -> list[dict[str, Any]]:
        if isinstance(move, CallProposed):
            kind = "tool-input-available" if move.valid else "tool-input-error"
            chunk: dict[str, Any] = {
                "type": kind,
                "toolCallId": move.call_id,
                "toolName": move.name,
                "input": move.input,
            }
            if not move.valid:
                chunk["errorText"] = "the call's arguments are not a JSON object"
            return [chunk]
        if isinstance(move, ApprovalAsked):
            return [
                {
                    "type": "tool-approval-request",
                    "approvalId": move.call_id,
                    "toolCallId": move.call_id,
                }
            ]
        if isinstance(move, CallResult):
            return [
                {"type": "tool-output-available", "toolCallId": move.call_id, "output": move.output}
            ]
        if isinstance(move, CallDenied):
            return [{"type": "tool-output-denied", "toolCallId": move.call_id}]
        if isinstance(move, CallFailed):
            return [
                {"type": "tool-output-error", "toolCallId": move.call_id, "errorText": move.message}
            ]
        return []

    def _finish_step(self) -> list[dict[str, Any]]:
        out = [{"type": "text-end", "id": part} for part in sorted(self._text_open)]
        self._text_open.clear()
        if self._step_open:
            self._step_open = False
            out.append({"type": "finish-step"})
        return out

    def _ended(self, move: Ended) -> list[dict[str, Any]]:
        out = self._finish_step()
        if move.status == "failed":
            out.append({"type": "error", "errorText": move.error or "the turn failed"})
        meta: dict[str, Any] = {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "status": move.status,
            "next_offset": move.next_offset,
        }
        if move.error:
            meta["error"] = move.error
        reason = _FINISH_REASONS.get(move.status, "other")
        out.append({"type": "finish", "finishReason": reason, "messageMetadata": {"lodger": meta}})
        return out

    def failed(self, text: str, *, next_offset: int) -> list[dict[str, Any]]:
        """The chunks that end a stream that cannot go on (``text`` says why)."""
        out: list[dict[str, Any]] = []
        if self.turn_id is None:
            out.append({"type": "start"})
        out += self._finish_step()
        out.append({"type": "error", "errorText": text})
        meta = {"session_id": self.session_id, "status": "error", "next_offset": next_offset}
        out.append({"type": "finish", "finishReason": "error", "messageMetadata": {"lodger": meta}})
        return out
