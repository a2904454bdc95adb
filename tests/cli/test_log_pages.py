"""``lodger log show`` a page of turns at a time, ``sessions`` and ``log verify`` over the
chain checked on stored bytes, on real SQLite logs of several turns."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console
from rich.text import Text

from lodger.cli import main
from lodger.cli._log import print_lines
from lodger.cli._render import render_timeline, visible_line
from lodger.cli._timeline import TurnIndex, build_timeline, index_turns, select_page
from lodger.errors import CorruptLogError, SessionNotFoundError, UsageError
from lodger.events import (
    Body,
    Event,
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    TurnEnded,
    TurnStarted,
    chain_digest,
    seal,
)
from lodger.storage import EventLog, SqliteLogStore
from lodger.storage.logstore import Record

SESSION = "s-turns"
T0 = 1_700_000_000_000_000
LONG_INPUT = "please " * 60  # longer than the clipped view shows
# offsets: session_started 0, turn n (1..3) covers [8n - 7, 8n + 1)
TURNS = {1: range(1, 9), 2: range(9, 17), 3: range(17, 25)}
_OFFSET = re.compile(r"^\s*(\d+)\s")


def turn_drafts(n: int) -> list[EventDraft]:
    """One turn of eight events; turn 2's tool result mentions ``turn_started`` in text."""
    turn = {"turn_id": f"t{n}"}
    run = {**turn, "run_id": f"r{n}"}
    step = {**run, "step_id": f"st{n}"}
    call = ProposedCall(call_id=f"c{n}", name="grep", arguments='{"pattern": "kind"}')
    content = '{"kind":"turn_started"} found in log.json' if n == 2 else f"result {n}"
    bodies: list[tuple[Body, dict[str, str]]] = [
        (TurnStarted(input=LONG_INPUT if n == 1 else f"question {n}"), turn),
        (RunStarted(model="scripted:pages"), run),
        (
            StepStarted(
                index=0, model="scripted:pages", tools=(ToolRef(name="grep", schema_digest="d"),)
            ),
            step,
        ),
        (ModelOutput(text=f"looking {n}", calls=(call,)), step),
        (
            ToolDispatched(operation_id=f"op{n}", tool="grep", arguments={"pattern": "kind"}),
            {**step, "call_id": f"c{n}"},
        ),
        (
            ToolResponded(operation_id=f"op{n}", status="ok", content=content),
            {**step, "call_id": f"c{n}"},
        ),
        (RunEnded(status="completed"), run),
        (TurnEnded(status="completed", answer=f"answer {n}"), turn),
    ]
    return [
        EventDraft(id=f"e{n}-{i}", ts=T0 + (100 * n + i) * 1000, body=body, **envelope)
        for i, (body, envelope) in enumerate(bodies)
    ]


def all_drafts() -> list[EventDraft]:
    start = EventDraft(id="e0", ts=T0, body=SessionStarted(workspace="/projects/pages"))
    return [start, *turn_drafts(1), *turn_drafts(2), *turn_drafts(3)]


async def _write(state: Path, drafts: list[EventDraft]) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SESSION) as writer:
            for begin in range(0, len(drafts), 5):  # appends of a few events, as a runtime
                await writer.append(drafts[begin : begin + 5], expected_offset=begin)
    finally:
        await log.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    asyncio.run(_write(path, all_drafts()))
    return path


@pytest.fixture
def runner() -> CliRunner:
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    return CliRunner(env=env)


def show(runner: CliRunner, state: Path, *args: str) -> Result:
    return runner.invoke(main, ["log", "show", SESSION, "--state", str(state), *args])


def offsets(output: str) -> list[int]:
    """Offsets of the timeline lines (header and notes have none)."""
    return [int(m[1]) for line in output.splitlines() if (m := _OFFSET.match(line))]


def expected(*turns: int) -> set[int]:
    return {0}.union(*(set(TURNS[n]) for n in turns))


# ---------------------------------------------------------------- pages


def test_show_defaults_to_the_last_turn_and_names_the_hidden_ones(
    runner: CliRunner, state: Path
) -> None:
    result = show(runner, state)
    assert result.exit_code == 0, result.output
    header, note, *_ = result.stdout.splitlines()
    assert header.startswith(f"session {SESSION}  25 events, head digest ")
    assert note == (
        f"showing turn 3 of 3; turns 1-2 hidden: `lodger log show {SESSION} --state {state} "
        "--turn N` shows turn N, `--last-turns N` the last N turns, `--all` everything"
    )
    assert set(offsets(result.stdout)) == expected(3)
    assert "turn #3 t3" in result.stdout
    assert result.stderr == ""


def test_show_picks_turns_by_number(runner: CliRunner, state: Path) -> None:
    one = show(runner, state, "--turn", "1")
    assert set(offsets(one.stdout)) == expected(1)
    assert "turn #1 t1" in one.stdout
    assert "showing turn 1 of 3; turns 2-3 hidden" in one.stdout
    both = show(runner, state, "--turn", "3", "--turn", "1")
    assert set(offsets(both.stdout)) == expected(1, 3)
    assert "showing turns 1, 3 of 3; turn 2 hidden" in both.stdout
    last_two = show(runner, state, "--last-turns", "2")
    assert set(offsets(last_two.stdout)) == expected(2, 3)
    assert "showing turns 2-3 of 3; turn 1 hidden" in last_two.stdout
    more = show(runner, state, "--last-turns", "7")
    assert set(offsets(more.stdout)) == set(range(25))
    assert "hidden" not in more.stdout


def test_show_all_is_every_turn_unclipped(runner: CliRunner, state: Path) -> None:
    result = show(runner, state, "--all")
    assert result.exit_code == 0
    assert set(offsets(result.stdout)) == set(range(25))
    assert "hidden" not in result.stdout
    assert LONG_INPUT.strip() in result.stdout
    clipped = show(runner, state, "--turn", "1")
    assert LONG_INPUT.strip() not in clipped.stdout
    assert "chars)" in clipped.stdout
    assert LONG_INPUT.strip() in show(runner, state, "--turn", "1", "--full").stdout


def test_text_mentioning_a_turn_start_is_not_one(runner: CliRunner, state: Path) -> None:
    result = show(runner, state, "--turn", "2")
    assert set(offsets(result.stdout)) == expected(2)
    assert '{"kind":"turn_started"} found' in result.stdout


def test_show_json_is_the_page_and_the_note_goes_to_stderr(runner: CliRunner, state: Path) -> None:
    result = show(runner, state, "--json")
    assert result.exit_code == 0
    events = json.loads(result.stdout)["events"]
    assert [e["offset"] for e in events] == sorted(expected(3))
    assert all(len(e["digest"]) == 64 for e in events)
    assert result.stderr.startswith("note: showing turn 3 of 3; turns 1-2 hidden")
    every = json.loads(show(runner, state, "--json", "--all").stdout)["events"]
    assert [e["offset"] for e in every] == list(range(25))
    assert every[1]["body"]["input"] == LONG_INPUT


def test_show_timing_covers_the_page(runner: CliRunner, state: Path) -> None:
    steps = json.loads(show(runner, state, "--timing", "--json", "--turn", "2").stdout)["steps"]
    assert [call["call_id"] for step in steps for call in step["calls"]] == ["c2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--turn", "4"], "error: the session has turns 1 to 3; turn 4 is not one of them"),
        (["--turn", "0"], "error: the session has turns 1 to 3; turn 0 is not one of them"),
        (["--all", "--turn", "1"], "error: --all shows every turn; it does not combine"),
        (["--turn", "1", "--last-turns", "2"], "error: --turn and --last-turns both pick turns"),
    ],
)
def test_show_refuses_bad_turn_choices(
    runner: CliRunner, state: Path, args: list[str], message: str
) -> None:
    result = show(runner, state, *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(message)
    assert "hint: " in result.stderr


def test_session_without_turns_shows_everything(runner: CliRunner, tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_write(state, all_drafts()[:1]))
    result = show(runner, state)
    assert result.exit_code == 0
    assert offsets(result.stdout) == [0]
    assert "hidden" not in result.stdout
    assert show(runner, state, "--turn", "1").stderr.startswith(
        "error: the session has no turns; turn 1 is not one of them"
    )


# ---------------------------------------------------------------- verification


def _rewrite(state: Path, offset: int, data: bytes) -> None:
    """Store the session again with ``data`` at ``offset`` and the chain recomputed after
    it, through the real store: what a writer that this version cannot read leaves."""
    drafts = all_drafts()
    records: list[Record] = []
    prev = ""
    for index, draft in enumerate(drafts):
        _, sealed_bytes = seal(draft, session_id=SESSION, offset=index, prev_digest=prev)
        stored = data if index == offset else sealed_bytes
        prev = chain_digest(prev, stored)
        records.append(Record(index, stored, prev))

    async def write() -> None:
        store = SqliteLogStore(state)
        try:
            await store.append_records(session_id=SESSION, records=records, expected_offset=0)
        finally:
            await store.close()

    asyncio.run(write())


def _unknown_field_at(offset: int) -> bytes:
    draft = all_drafts()[offset]
    _, data = seal(draft, session_id=SESSION, offset=offset, prev_digest="")
    return data.replace(b'"body":{', b'"body":{"colour":"red",', 1)


def _sql(state: Path, statement: str, *params: object) -> None:
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn, conn:
        conn.execute(statement, params)


def test_a_damaged_byte_in_a_hidden_turn_stops_every_command(
    runner: CliRunner, state: Path
) -> None:
    _sql(
        state,
        "UPDATE events SET data = replace(data, X'726573756c742031', X'726573756c742039') "
        'WHERE session_id = ? AND "offset" = 6',
        SESSION,
    )  # "result 1" -> "result 9" in turn 1's T2, behind lodger's back
    result = show(runner, state)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"error: log for session '{SESSION}' is invalid at offset 6: its digest does not match"
    )
    assert show(runner, state, "--json").stdout == ""
    rows = json.loads(runner.invoke(main, ["sessions", "--state", str(state), "--json"]).stdout)[
        "sessions"
    ]
    assert (rows[0]["last_status"], rows[0]["events"], rows[0]["error"]["offset"]) == (
        "corrupt",
        25,
        6,
    )
    verify = runner.invoke(main, ["log", "verify", SESSION, "--state", str(state)])
    assert (verify.exit_code, verify.stdout) == (1, "")
    assert "offset 6" in verify.stderr


def test_a_lost_tail_stops_the_page(runner: CliRunner, state: Path) -> None:
    _sql(state, 'DELETE FROM events WHERE session_id = ? AND "offset" >= 20', SESSION)
    result = show(runner, state, "--turn", "1")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "invalid at offset 20: the last append recorded 25 events" in result.stderr


def test_a_gap_in_a_hidden_turn_stops_the_page(runner: CliRunner, state: Path) -> None:
    _sql(state, 'DELETE FROM events WHERE session_id = ? AND "offset" = 3', SESSION)
    result = show(runner, state)
    assert result.exit_code == 1
    assert "invalid at offset 3: the event is missing although offset 4 is stored" in (
        result.stderr
    )


def test_sessions_summarizes_from_the_last_turn(runner: CliRunner, state: Path) -> None:
    result = runner.invoke(main, ["sessions", "--state", str(state), "--json"])
    (row,) = json.loads(result.stdout)["sessions"]
    assert (row["events"], row["turns"], row["last_status"]) == (25, 3, "completed")
    assert row["workspace"] == "/projects/pages"
    assert row["last_ts"] == T0 + (300 + 7) * 1000


def test_verify_fails_closed_on_an_event_that_does_not_decode(
    runner: CliRunner, tmp_path: Path
) -> None:
    """The chain holds (a writer this version cannot read), the decode does not: verify
    decodes every event and fails; a page decodes what it shows and fails when it shows
    the event; the last turn's page verifies the chain over every byte and shows."""
    state = tmp_path / "state"
    _rewrite(state, 4, _unknown_field_at(4))
    verify = runner.invoke(main, ["log", "verify", SESSION, "--state", str(state), "--json"])
    assert verify.exit_code == 1
    error = json.loads(verify.stdout)["error"]
    assert (error["code"], error["offset"]) == ("unknown_field", 4)
    shown = show(runner, state, "--turn", "1")
    assert shown.exit_code == 1
    assert shown.stdout == ""
    assert "invalid at offset 4: body.model_output.colour" in shown.stderr
    assert show(runner, state, "--all").exit_code == 1
    last = show(runner, state)
    assert last.exit_code == 0
    assert set(offsets(last.stdout)) == expected(3)


# ---------------------------------------------------------------- pieces


def test_select_page_numbers_turns_from_one() -> None:
    index = TurnIndex(high_water=25, starts=(1, 9, 17))
    assert index.span(1) == (1, 9)
    assert index.span(3) == (17, 25)
    assert index.preamble() == (0, 1)
    assert (index.number_at(9), index.number_at(10)) == (2, None)
    page = select_page(index, turns=(3, 1))
    assert page.ranges() == [(0, 9), (17, 25)]
    assert page.hidden() == [(2, 2)]
    assert select_page(index).ranges() == [(0, 1), (17, 25)]
    assert select_page(index, every=True).ranges() == [(0, 25)]
    assert select_page(index, every=True).complete
    with pytest.raises(UsageError, match="--last-turns takes 1 or more"):
        select_page(index, last=0)


def _read_all(state: Path) -> list[Event]:
    async def read() -> list[Event]:
        log = EventLog(SqliteLogStore(state))
        try:
            return await log.read_all(SESSION)
        finally:
            await log.close()

    return asyncio.run(read())


def test_read_verified_decodes_on_demand(state: Path) -> None:
    async def check() -> None:
        log = EventLog(SqliteLogStore(state))
        try:
            verified = await log.read_verified(SESSION)
            assert len(verified) == 25
            assert verified.records[-1].digest == (await log.head(SESSION)).digest
            assert verified.decode(9, 17) == (await log.read(SESSION))[9:17]
            assert index_turns(verified).starts == (1, 9, 17)
            with pytest.raises(UsageError, match="invalid range"):
                verified.decode(26)
            with pytest.raises(SessionNotFoundError, match="no log for session 'nope'"):
                await log.read_verified("nope")
        finally:
            await log.close()

    asyncio.run(check())


def test_read_verified_fails_closed_like_a_full_read(state: Path) -> None:
    _rewrite(state.parent / "other", 12, _unknown_field_at(12))

    async def check() -> None:
        log = EventLog(SqliteLogStore(state.parent / "other"))
        try:
            verified = await log.read_verified(SESSION)  # the chain over the bytes holds
            with pytest.raises(CorruptLogError, match="offset 12") as decoded:
                await log.read_verified(SESSION, decode_all=True)
            with pytest.raises(CorruptLogError) as full:
                await log.read_all(SESSION)
            assert (decoded.value.code, full.value.code) == ("unknown_field", "unknown_field")
            with pytest.raises(CorruptLogError, match="offset 12"):
                verified.decode(10, 14)
        finally:
            await log.close()

    asyncio.run(check())


def test_plain_output_matches_what_rich_prints(state: Path) -> None:
    """Without colors the lines are written as plain text; rich would print the same."""
    lines = render_timeline(build_timeline(_read_all(state)), full=True)
    lines += [Text("a\ttab"), Text("wide 漢字 and \x1b[31mescape\x1b[0m"), Text("")]
    printed, written = io.StringIO(), io.StringIO()
    rich_console = Console(file=printed, width=80, highlight=False, emoji=False)
    for line in lines:  # control characters from a log are shown as escapes, never sent
        rich_console.print(visible_line(line), soft_wrap=True)
    plain_console = Console(file=written, width=80, highlight=False, emoji=False)
    assert plain_console.color_system is None
    print_lines(plain_console, lines)
    assert written.getvalue() == printed.getvalue()
    assert "a       tab" in written.getvalue()
    assert "\\x1b[31mescape" in written.getvalue() and "\x1b" not in written.getvalue()
