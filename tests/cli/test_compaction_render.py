"""``lodger log show`` gives ``compacted`` and ``compaction_failed`` a readable line each:
what the compaction covered, tokens before and after, what it dropped, trigger and model;
or why it failed and what the step did instead."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main
from lodger.events import (
    Body,
    Compacted,
    CompactionFailed,
    EventDraft,
    ModelOutput,
    Prefix,
    RunStarted,
    SessionStarted,
    TurnStarted,
)
from lodger.storage import EventLog, SqliteLogStore

SESSION = "s-compacted"
LONG = " more" * 40 + " END"


async def _write(state: Path) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SESSION) as writer:
            drafts = [
                EventDraft(id="e0", ts=1_700_000_000_000_000, body=SessionStarted()),
                EventDraft(
                    id="e1", ts=1_700_000_000_001_000, body=TurnStarted(input="go"), turn_id="t1"
                ),
            ]
            started = await writer.append(drafts, expected_offset=0)
            head = Prefix(high_water=2, digest=started[-1].digest)
            turn = {"turn_id": "t1", "run_id": "r1"}
            bodies: list[Body] = [
                RunStarted(model="function:m"),
                CompactionFailed(
                    covers=head,
                    trigger="overflow",
                    attempts=2,
                    reason="the summary has no 'next step' section",
                ),
                Compacted(
                    covers=head,
                    summary="## Goal\nship it\n## Next step\ntest \x1b[2J it" + LONG,
                    dropped_call_ids=("c1", "c2", "c3"),
                    dropped_bytes=123_456,
                    dropped_tokens=30_864,
                    pinned=("turn_input", "todo"),
                    model="function:summarizer",
                    prompt_sha256="0" * 64,
                    tokens_before=41_000,
                    tokens_after=2_500,
                    trigger="manual",
                    previous=1,
                ),
                ModelOutput(text="done"),
            ]
            await writer.append(
                [
                    EventDraft(id=f"e{i}", ts=1_700_000_000_002_000 + i, body=body, **turn)  # type: ignore[arg-type]
                    for i, body in enumerate(bodies, start=2)
                ],
                expected_offset=2,
            )
    finally:
        await log.close()


def _show(state: Path, *extra: str) -> str:
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1", "LODGER_STATE": None})
    result = runner.invoke(
        main, ["log", "show", SESSION, "--state", str(state), *extra], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_log_show_describes_a_compaction_and_a_failed_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_write(state))
    out = _show(state)
    [done] = [line for line in out.splitlines() if " compacted " in line]
    assert "covers [0, 2)" in done
    assert "tokens 41,000 -> 2,500" in done
    assert "dropped 3 calls, 123,456 bytes (~30,864 tokens)" in done
    assert "trigger=manual" in done and "model=function:summarizer" in done
    assert "chains #1" in done and "pinned: turn_input, todo" in done
    assert '"## Goal ship it' in done
    assert "\x1b" not in out  # the summary's escape is shown, never sent
    assert "\\x1b[2J" in done
    [failed] = [line for line in out.splitlines() if "compaction failed" in line]
    assert "after 2 attempt(s): the summary has no 'next step' section" in failed
    assert "fallback=elision" in failed and "trigger=overflow" in failed


def test_log_show_all_shows_the_whole_summary(tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_write(state))
    short = _show(state)
    full = _show(state, "--all")
    assert "END" in full and "END" not in short
    assert "(+" in short  # clipped, with a note of what was left out
