"""Compaction as a projection of the log: a long session stays under its budget, a fact
of step 5 is still answerable at step 200 (through the summary, or through ``recall``
when the summary lost it), a bad summary is retried and then left to elision, and the
breaker stops repeats. Real SQLite storage; the models are FunctionModels
(``compaction_world``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from compaction_world import SECRET, World, agent, policy

from lodger.context import project_messages
from lodger.engine.checkpoint import decode_or_why, open_fold, save_checkpoint
from lodger.engine.compaction import (
    SUMMARY_PROMPT_SHA256,
    CompactionPolicy,
    missing_sections,
)
from lodger.errors import ConfigError, ProviderError, UsageError
from lodger.events import Compacted, CompactionFailed, ContextCompacted, Event
from lodger.providers.base import AssistantMessage, ToolResultMessage, UserMessage
from lodger.storage import Storage


def _kinds(events: list[Event], cls: type) -> list[Event]:
    return [e for e in events if isinstance(e.body, cls)]


@pytest.mark.slow
async def test_a_200_step_session_stays_under_budget_and_keeps_the_step_5_fact(
    tmp_path: Path,
) -> None:
    world = World(steps=200)
    async with agent(tmp_path / "state", world) as a:
        result = await a.run("read every page, then tell me the secret code", session="s")
        events = await a.log.read_all("s")
        await a.log.verify("s")
    assert result.status == "completed", result.error
    assert result.answer == f"the secret code is {SECRET}"
    compactions = _kinds(events, Compacted)
    assert len(compactions) >= 10
    # every request fit the 32k budget, tools and system prompt included
    assert max(total for _, total in world.sizes) <= 32_000
    # 200 pages of 8000 characters: about 400k tokens of tool output went through
    assert sum(len(e.body.content) for e in events if e.kind == "tool_responded") >= 1_600_000
    # without compaction the last request alone would have held all of it
    without = project_messages(events[: compactions[0].offset]).estimated_tokens
    assert without > 24_000
    sent = sum(messages for messages, _ in world.sizes)
    assert sent < 0.2 * _uncompacted_total(events)
    first = compactions[0].body
    assert isinstance(first, Compacted)
    assert first.prompt_sha256 == SUMMARY_PROMPT_SHA256
    assert first.model == "function:world" and first.trigger in ("threshold", "overflow")
    assert first.covers.high_water <= compactions[0].offset
    assert first.tokens_after < first.tokens_before and first.dropped_call_ids
    # chained: each names the one before it
    for earlier, later in itertools.pairwise(compactions):
        assert isinstance(later.body, Compacted) and later.body.previous == earlier.offset
    assert f"secret code is {SECRET}" in compactions[-1].body.summary


def _uncompacted_total(events: list[Event]) -> int:
    """Tokens the requests of the session would have sent without compaction: each
    step's whole history up to it."""
    total = 0
    plain = [e for e in events if not isinstance(e.body, Compacted | CompactionFailed)]
    steps = [i for i, e in enumerate(plain) if e.kind == "step_started"]
    chars = 0
    cursor = 0
    for index in steps:
        for e in plain[cursor:index]:
            body = e.body
            chars += len(getattr(body, "content", "") or getattr(body, "input", "") or "")
        cursor = index
        total += chars // 4
    return total


async def test_a_fact_the_summary_lost_comes_back_through_recall(tmp_path: Path) -> None:
    world = World(steps=40, summarizer="forgetful")
    async with agent(tmp_path / "state", world, policy(threshold_tokens=8000)) as a:
        assert "recall" in a.registry.names()
        result = await a.run("read every page, then tell me the secret code", session="s")
        events = await a.log.read_all("s")
    assert result.status == "completed", result.error
    assert result.answer == f"the secret code is {SECRET}"
    compactions = _kinds(events, Compacted)
    assert compactions and all(SECRET not in e.body.summary for e in compactions)
    recalled = [e for e in events if e.kind == "tool_responded" and SECRET in e.body.content]
    assert recalled[-1].offset > compactions[-1].offset  # fetched back after it was dropped


async def test_a_bad_summary_is_retried_then_the_step_falls_back_to_elision(
    tmp_path: Path,
) -> None:
    world = World(steps=30, summarizer="bad")
    compaction = policy(threshold_tokens=8000, budget_tokens=12_000, max_attempts=2)
    async with agent(tmp_path / "state", world, compaction) as a:
        result = await a.run("read the pages", session="s")
        events = await a.log.read_all("s")
    assert result.status == "completed", result.error
    failed = _kinds(events, CompactionFailed)
    assert not _kinds(events, Compacted)
    # the breaker: one failure (two attempts) for this stretch of the log in this turn
    assert len(failed) == 1 and world.summaries == 2
    body = failed[0].body
    assert isinstance(body, CompactionFailed)
    assert body.attempts == 2 and "Next step" in body.reason and body.fallback == "elision"
    # the fallback: old results elided to the budget, every later request under it
    assert _kinds(events, ContextCompacted)
    after = [m for m, _ in world.sizes[len(world.sizes) // 2 :]]
    assert max(after) <= 12_000


async def test_a_summary_that_passes_on_the_second_attempt_is_kept(tmp_path: Path) -> None:
    world = World(steps=12)
    kinds = iter(["bad", "good"])

    def switch(request: object) -> None:
        world.summarizer = next(kinds, "good")

    world.on_summary = switch
    compaction = policy(threshold_tokens=8000, budget_tokens=12_000)
    async with agent(tmp_path / "state", world, compaction) as a:
        await a.run("read the pages", session="s")
        events = await a.log.read_all("s")
    assert not _kinds(events, CompactionFailed)
    assert _kinds(events, Compacted) and world.summaries >= 2


async def test_the_breaker_bounds_compactions_per_turn_and_lets_a_new_turn_try(
    tmp_path: Path,
) -> None:
    world = World(steps=30)
    compaction = policy(threshold_tokens=4000, budget_tokens=12_000, max_per_turn=2)
    async with agent(tmp_path / "state", world, compaction) as a:
        await a.run("read the pages", session="s")
        first = await a.log.read_all("s")
        assert len(_kinds(first, Compacted)) == 2
        world.summarizer = "bad"
        world.steps = 60  # the second turn reads on
        before = world.summaries
        await a.run("read on", session="s")
        events = await a.log.read_all("s")
    second = events[len(first) :]
    # the threshold compaction before the turn failed (two attempts) and the turn's own
    # triggers left that stretch alone: no third, fourth ... attempt
    failures = _kinds(second, CompactionFailed)
    assert len(failures) == 1
    assert failures[0].turn_id is None and failures[0].body.trigger == "threshold"
    assert second[failures[0].offset - len(first) + 1].kind == "turn_started"
    assert world.summaries - before == 2


async def test_a_compacted_context_is_a_pure_function_of_the_log(tmp_path: Path) -> None:
    """The fold the run used, a fresh fold, a checkpoint's fold and ``project_messages``
    over the events all give the same request; every prefix keeps calls whole."""
    world = World(steps=40)
    state_dir = tmp_path / "state"
    async with agent(state_dir, world, policy(threshold_tokens=6000)) as a:
        await a.run("read the pages", session="s")
        live = a._states["s"].projector.project().messages
        events = await a.log.read_all("s")
    assert _kinds(events, Compacted)
    assert tuple(project_messages(events).messages) == tuple(live)
    storage = Storage.local(state_dir)
    try:
        fold = await open_fold(storage.log, "s")
        assert tuple(fold.projector.project().messages) == tuple(live)
        # a checkpoint's fold restores the newest compaction without reading what it covers
        assert await save_checkpoint(storage.log, fold)
        data = await storage.log.checkpoints.load_checkpoint(session_id="s")
        assert data is not None
        restored = decode_or_why(data, await storage.log.read_verified("s"))
        assert not isinstance(restored, str), restored
        assert tuple(restored.projector.project().messages) == tuple(live)
    finally:
        await storage.close()
    head = live[0]
    assert isinstance(head, UserMessage) and head.source == "runtime"
    assert "## Summary" in head.text
    # compacted inside the turn: its input stays pinned above the summary
    assert "## Task of the current turn\nread the pages" in head.text
    for n in range(1, len(events) + 1, 7):
        _assert_calls_whole(project_messages(events[:n]).messages)


def _assert_calls_whole(messages: object) -> None:
    proposed: set[str] = set()
    answered: set[str] = set()
    for m in messages:  # type: ignore[attr-defined]
        if isinstance(m, AssistantMessage):
            proposed.update(c.call_id for c in m.calls)
        elif isinstance(m, ToolResultMessage):
            assert m.call_id in proposed, f"result of {m.call_id} without its call"
            answered.add(m.call_id)
    assert proposed == answered, "a call without its result"


async def test_manual_compaction_and_its_refusals(tmp_path: Path) -> None:
    world = World(steps=6)
    async with agent(tmp_path / "state", world, policy()) as a:
        await a.run("read the pages", session="s")
        head = (await a.log.read_all("s"))[-1]
        made = await a.compact("s", instructions="keep the page numbers")
        events = await a.log.read_all("s")
        assert events[-1].body == made and made.trigger == "manual"
        assert made.covers.high_water == head.offset + 1 and made.covers.digest == head.digest
        assert made.previous is None and made.dropped_call_ids
        await a.log.verify("s")
        # the next turn starts from the summary
        world.steps = 7
        await a.run("one more page", session="s")
        events = await a.log.read_all("s")
        context = project_messages(events).messages
        assert isinstance(context[0], UserMessage) and "pages read: 6" in context[0].text
        with pytest.raises(UsageError) as missing:
            await a.compact("nobody")
        assert missing.value.code == "session_not_found"
    world.summarizer = "bad"
    async with agent(tmp_path / "state", world, policy()) as a:
        with pytest.raises(ProviderError) as failed:
            await a.compact("s")
        assert failed.value.code == "compaction_failed"
        assert (await a.log.read_all("s"))[-1].kind == "compaction_failed"
        with pytest.raises(UsageError) as again:
            await a.compact("s")  # the same prefix: refused without asking the model
        assert again.value.code == "compaction_refused"


def test_required_sections_and_policy_checks() -> None:
    summary = "## Goal\nx\n**Progress**\ny\nDecisions:\nz\n# files touched\n- a\n"
    assert missing_sections(summary, ("Goal", "Progress", "Decisions", "Files touched")) == []
    assert missing_sections(summary, ("Next step",)) == ["Next step"]
    with pytest.raises(ConfigError):
        CompactionPolicy(budget_tokens=0)
    with pytest.raises(ConfigError):
        CompactionPolicy(max_attempts=0)
    with pytest.raises(ConfigError):
        CompactionPolicy(required_sections=("",))
