"""One session, several providers: a session started on OpenAI chat goes on on Anthropic,
on OpenAI Responses, on Gemini, and back, each leg against its own loopback wire server through the
real adapter. Every later request carries the whole history in that provider's format
(tool calls paired with their results by the ids the first provider gave them), a
provider's reasoning state reaches that provider again and no other, and the log verifies.

A provider joins by adding its ``Dialect`` (``wire_dialects``) to ``LEGS``.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

from wire_dialects import ANTHROPIC, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES, Dialect, Turn
from wire_server import WireServer

from lodger import Agent
from lodger.events import ModelOutput, RunStarted
from lodger.storage import Storage
from lodger.tools import tool


@tool(recovery="idempotent")
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


#: the providers the session runs on, in order: each leg is one turn (a call, an answer)
LEGS: tuple[Dialect, ...] = (
    OPENAI_CHAT,
    ANTHROPIC,
    OPENAI_RESPONSES,
    GEMINI,
    ANTHROPIC,
    GEMINI,
    OPENAI_CHAT,
)


def _expected_leg(leg: int, dialect: Dialect) -> tuple[list[Turn], list[Turn]]:
    """What this leg's two requests add to the conversation: its question; then its call,
    and the call's result."""
    call_id = f"call_{leg}_{dialect.name}"
    asked = [("user", f"question {leg}")]
    called = [("call", call_id, "lookup"), ("result", call_id, f"value of k{leg}")]
    return asked, called


def _assistant_text(dialect: Dialect) -> list[Turn]:
    return [("assistant", "Looking.")] if dialect is OPENAI_CHAT else []


def _seen_by(dialect: Dialect, turns: list[Turn]) -> list[Turn]:
    """The conversation as ``dialect``'s wire can carry it. Gemini pairs a call with its
    result by name and order and takes back only the call ids it made itself, so another
    provider's ids reach it blank (the order still pairs them: checked as a sequence)."""
    if dialect is not GEMINI:
        return turns
    out: list[Turn] = []
    for turn in turns:
        if turn[0] in ("call", "result") and not turn[1].endswith("_gemini"):
            turn = (turn[0], "", *turn[2:])
        out.append(turn)
    return out


async def test_a_session_moves_between_providers_with_its_history(tmp_path: Path) -> None:
    storage = Storage.local(tmp_path / "state")
    history: list[Turn] = []  # what every provider must see, in its own format
    session: str | None = None
    specs: list[str] = []
    with ExitStack() as servers:
        wires = {d.name: servers.enter_context(WireServer()) for d in set(LEGS)}
        for leg, dialect in enumerate(LEGS):
            server = wires[dialect.name]
            before = len(server.requests)
            call_id = f"call_{leg}_{dialect.name}"
            server.push(
                dialect.call(call_id, "lookup", {"key": f"k{leg}"}),
                dialect.answer(f"answer {leg}"),
            )
            async with Agent(model=dialect.model(server), tools=[lookup], storage=storage) as agent:
                result = await agent.run(f"question {leg}", session=session)
                specs.append(agent.model.spec)
                await agent.model.aclose()
            assert result.status == "completed", result.error
            assert result.answer == f"answer {leg}"
            session = result.session_id

            first, second = (r.body for r in server.requests[before:])
            asked, called = _expected_leg(leg, dialect)
            assert dialect.history(first) == _seen_by(dialect, [*history, *asked])
            step = [*asked, *_assistant_text(dialect), *called]
            assert dialect.history(second) == _seen_by(dialect, [*history, *step])
            _check_reasoning_state(leg, dialect, first, second)
            history += [
                *asked,
                *_assistant_text_of_leg(leg),
                *called,
                ("assistant", f"answer {leg}"),
            ]

    async with Agent(model="test", storage=storage) as reader:
        assert session is not None
        await reader.log.verify(session)  # the digest chain holds over every leg
        events = await reader.log.read_all(session)
    ran = [e.body.model for e in events if isinstance(e.body, RunStarted)]
    assert ran == specs
    outputs = [e.body for e in events if isinstance(e.body, ModelOutput)]
    assert len(outputs) == 2 * len(LEGS)
    await storage.close()


def _assistant_text_of_leg(leg: int) -> list[Turn]:
    """The text a leg's calling step said before its call, as the history keeps it."""
    return _assistant_text(LEGS[leg])


def _check_reasoning_state(
    leg: int, dialect: Dialect, first: dict[str, object], second: dict[str, object]
) -> None:
    """Each provider's reasoning state goes back to that provider (its own step in
    ``second``) and never to another one."""
    for other in set(LEGS):
        marker = other.state_marker
        if marker is None:
            continue
        earlier = [LEGS[n] for n in range(leg)]
        if other is dialect:
            assert marker in json.dumps(second), f"{dialect.name} lost its own reasoning state"
            if other in earlier:  # an earlier leg on this provider: kept in the history
                assert marker in json.dumps(first)
        else:
            assert marker not in json.dumps(first), f"{other.name}'s state sent to {dialect.name}"
            assert marker not in json.dumps(second), f"{other.name}'s state sent to {dialect.name}"


def _ids(history: list[Turn]) -> list[str]:
    return [turn[1] for turn in history if turn[0] in ("call", "result")]


async def test_call_ids_another_provider_refuses_go_as_stable_digests(tmp_path: Path) -> None:
    """A compatible server's ``functions.lookup:0`` is no Anthropic id, and the id lodger
    gives a call whose id the server reused (``call-`` and a UUID, 41 characters) is too
    long for OpenAI: each provider gets a digest it takes, a call paired with its result."""
    storage = Storage.local(tmp_path / "state")
    with WireServer() as chat, WireServer() as claude:
        kimi = "functions.lookup:0"
        chat.push(OPENAI_CHAT.call(kimi, "lookup", {"key": "a"}), OPENAI_CHAT.answer("a done"))
        claude.push(ANTHROPIC.answer("noted"))
        chat.push(OPENAI_CHAT.call(kimi, "lookup", {"key": "b"}), OPENAI_CHAT.answer("b done"))
        session = None
        for model, task in ((OPENAI_CHAT, "a?"), (ANTHROPIC, "ok?"), (OPENAI_CHAT, "b?")):
            made = model.model(chat if model is OPENAI_CHAT else claude)
            async with Agent(model=made, tools=[lookup], storage=storage) as agent:
                result = await agent.run(task, session=session)
            await made.aclose()
            assert result.status == "completed", result.error
            session = result.session_id
        to_claude = _ids(ANTHROPIC.history(claude.requests[0].body))
        last_chat = _ids(OPENAI_CHAT.history(chat.requests[-1].body))
    assert len(to_claude) == 2 and to_claude[0] == to_claude[1]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", to_claude[0])
    assert last_chat[:2] == [kimi, kimi]  # the server's own id goes back to it as it was
    renamed = last_chat[2]
    assert renamed == last_chat[3] and renamed != kimi and len(renamed) <= 40
    async with Agent(model="test", storage=storage) as reader:
        assert session is not None
        await reader.log.verify(session)
        events = await reader.log.read_all(session)
    logged = [c.call_id for e in events if isinstance(e.body, ModelOutput) for c in e.body.calls]
    assert logged[0] == kimi and len(logged[1]) == 41  # the log keeps the ids it gave
    await storage.close()
