"""``lodger log show`` gives ``process_started`` and ``process_ended`` a line each: the
handle, pid, keep policy and command (escaped); how it ended and, for a limit, which."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main
from lodger.events import (
    Body,
    EventDraft,
    ProcessEnded,
    ProcessStarted,
    RunStarted,
    SessionStarted,
    TurnStarted,
)
from lodger.storage import EventLog, SqliteLogStore

SESSION = "s-processes"


async def _write(state: Path) -> None:
    log = EventLog(SqliteLogStore(state))
    try:
        async with await log.open_writer(SESSION) as writer:
            turn = {"turn_id": "t1", "run_id": "r1"}
            bodies: list[Body] = [
                SessionStarted(),
                TurnStarted(input="go"),
                RunStarted(model="function:m"),
                ProcessStarted(
                    process_id="proc-c1",
                    operation_id="op1",
                    command="python3 -m http.server 8000 \x1b[2J",
                    pid=4242,
                    sandbox="bubblewrap start=1 boot=b",
                ),
                ProcessEnded(process_id="proc-c1", status="limit", reason="cpu_time"),
                ProcessEnded(process_id="proc-c2", status="unknown", reason="not running"),
            ]
            await writer.append(
                [
                    EventDraft(
                        id=f"e{i}",
                        ts=1_700_000_000_000_000 + i,
                        body=body,
                        **(turn if i else {}),  # type: ignore[arg-type]
                    )
                    for i, body in enumerate(bodies)
                ],
                expected_offset=0,
            )
    finally:
        await log.close()


def test_log_show_describes_background_processes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_write(state))
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1", "LODGER_STATE": None})
    result = runner.invoke(
        main, ["log", "show", SESSION, "--state", str(state)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    [started] = [line for line in out.splitlines() if "process started" in line]
    assert "proc-c1 pid=4242 keep=turn op=op1" in started
    assert "python3 -m http.server 8000 \\x1b[2J" in started and "\x1b" not in out
    [limit, unknown] = [line for line in out.splitlines() if "process ended" in line]
    assert "proc-c1 limit limit=cpu_time output=0 bytes" in limit
    assert "proc-c2 unknown (not running)" in unknown
