"""AG-UI events (protocol 1.0): what ``@ag-ui/client``'s ``HttpAgent`` reads.

Server-sent events whose ``data`` is one JSON event each. One AG-UI run is one stream of
a lodger turn (its first stream, or the continuation after an approval):

- ``RUN_STARTED`` (the input's ``threadId`` and ``runId``), then per step
  ``STEP_STARTED`` ... ``STEP_FINISHED`` (``stepName``: the step's id);
- text: ``TEXT_MESSAGE_START`` / ``TEXT_MESSAGE_CONTENT`` / ``TEXT_MESSAGE_END`` (the
  message id is the step's, so a step's text and calls are one assistant message);
- a call: ``TOOL_CALL_START`` (``parentMessageId``: the step's message), one
  ``TOOL_CALL_ARGS`` with the whole arguments, ``TOOL_CALL_END``, and later
  ``TOOL_CALL_RESULT`` (its content; a refusal or failure as ``denied: ...`` or
  ``error: ...``);
- the end: ``CUSTOM`` ``lodger.turn`` (session, turn, status, ``next_offset``), then
  ``RUN_FINISHED`` with outcome ``success`` (``result``: the answer), ``cancelled``, or
  ``interrupt`` whose interrupts are the calls waiting for approval (``id`` and
  ``toolCallId``: the call's id, ``reason`` ``tool_approval``); a failed turn, or one
  left parked or interrupted, ends with ``RUN_ERROR`` (``code``: its status).
"""

from __future__ import annotations

import json
from typing import Any

from lodger.host.adapters.turn import (
    Began,
    CallDenied,
    CallFailed,
    CallProposed,
    CallResult,
    Ended,
    Move,
    StepBegan,
    Text,
    TextDone,
)

__all__ = ["AguiEvents", "sse_event"]


def sse_event(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


class AguiEvents:
    """Encodes one turn's moves as AG-UI events of the run ``run_id`` on ``thread_id``."""

    def __init__(self, *, session_id: str, thread_id: str, run_id: str) -> None:
        self.session_id = session_id
        self.thread_id = thread_id
        self.run_id = run_id
        self.turn_id: str | None = None
        self._step: str | None = None
        self._text_open: set[str] = set()

    def started(self) -> list[dict[str, Any]]:
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}]

    def events(self, move: Move) -> list[dict[str, Any]]:
        if isinstance(move, Began):
            self.turn_id = move.turn_id
            return []
        if isinstance(move, StepBegan):
            out = self._finish_step()
            self._step = move.step_id
            return [*out, {"type": "STEP_STARTED", "stepName": move.step_id}]
        if isinstance(move, Text):
            return self._text(move)
        if isinstance(move, TextDone):
            if move.part_id not in self._text_open:
                return []
            self._text_open.discard(move.part_id)
            return [{"type": "TEXT_MESSAGE_END", "messageId": move.part_id}]
        if isinstance(move, CallProposed):
            return self._call(move)
        if isinstance(move, CallResult | CallDenied | CallFailed):
            return [self._result(move)]
        if isinstance(move, Ended):
            return self._ended(move)
        return []  # reasoning and approval questions: the run's end names the questions

    def _text(self, move: Text) -> list[dict[str, Any]]:
        if not move.text:
            return []  # a content event's delta may not be empty
        out: list[dict[str, Any]] = []
        if move.part_id not in self._text_open:
            self._text_open.add(move.part_id)
            out.append(
                {"type": "TEXT_MESSAGE_START", "messageId": move.part_id, "role": "assistant"}
            )
        out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": move.part_id, "delta": move.text})
        return out

    def _call(self, move: CallProposed) -> list[dict[str, Any]]:
        start: dict[str, Any] = {
            "type": "TOOL_CALL_START",
            "toolCallId": move.call_id,
            "toolCallName": move.name,
        }
        parent = move.parent_call_id or self._step
        if parent is not None:
            start["parentMessageId"] = parent
        out = [start]
        if move.arguments:
            out.append(
                {"type": "TOOL_CALL_ARGS", "toolCallId": move.call_id, "delta": move.arguments}
            )
        out.append({"type": "TOOL_CALL_END", "toolCallId": move.call_id})
        return out

    def _result(self, move: CallResult | CallDenied | CallFailed) -> dict[str, Any]:
        if isinstance(move, CallResult):
            content = move.content
        elif isinstance(move, CallDenied):
            content = f"denied: {move.reason}"
        else:
            content = f"error: {move.message}"
        return {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"result-{move.call_id}",
            "toolCallId": move.call_id,
            "content": content,
            "role": "tool",
        }

    def _finish_step(self) -> list[dict[str, Any]]:
        out = [{"type": "TEXT_MESSAGE_END", "messageId": part} for part in sorted(self._text_open)]
        self._text_open.clear()
        if self._step is not None:
            out.append({"type": "STEP_FINISHED", "stepName": self._step})
            self._step = None
        return out

    def _ended(self, move: Ended) -> list[dict[str, Any]]:
        out = self._finish_step()
        turn = {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "status": move.status,
            "next_offset": move.next_offset,
        }
        out.append({"type": "CUSTOM", "name": "lodger.turn", "value": turn})
        end: dict[str, Any] = {
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
        }
        if move.status == "completed":
            end["outcome"] = {"type": "success"}
            end["result"] = move.answer
        elif move.status in ("cancelled", "abandoned"):
            end["outcome"] = {"type": "cancelled"}
        elif move.status == "waiting_for_approval" or (move.status == "parked" and move.asking):
            end["outcome"] = {
                "type": "interrupt",
                "interrupts": [
                    {
                        "id": asked.call_id,
                        "reason": "tool_approval",
                        "message": f"allow {asked.tool}? {asked.summary}".strip(),
                        "toolCallId": asked.call_id,
                    }
                    for asked in move.asking
                ],
            }
        else:  # failed, step_limit, parked on a budget, interrupted
            return [
                *out,
                self.error(move.error or f"the turn ended {move.status}", code=move.status),
            ]
        return [*out, end]

    def error(self, message: str, *, code: str) -> dict[str, Any]:
        return {"type": "RUN_ERROR", "message": message, "code": code}
