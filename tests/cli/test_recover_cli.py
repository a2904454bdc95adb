"""``lodger recover``, ``decide`` and ``resume`` on a session interrupted between T1 and T2."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main
from lodger.cli._toolsfile import load_tools_file
from lodger.errors import CommitFailedError
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, MemoryArtifactStore, SqliteLogStore, Storage
from lodger.storage.logstore import Record
from lodger.testing import FaultyLogStore

TOOLS = '''
from pathlib import Path
from lodger import tool

@tool
def charge(amount: int) -> str:
    """Charge a card."""
    log = Path(__file__).with_name("charges.txt")
    with log.open("a") as handle:
        handle.write(f"{amount}\\n")
    return f"charged {amount}"
'''

SCRIPT = [{"calls": [{"name": "charge", "args": {"amount": 5}}]}, {"text": "paid"}]


def first_t2(records: list[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


@pytest.fixture
async def interrupted(tmp_path: Path) -> Path:
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    agent = Agent(
        model=ScriptedModel.from_file(tmp_path / "script.json"),
        tools=[*workspace_tools(), *load_tools_file(str(tmp_path / "tools.py"))],
        storage=Storage(
            log=EventLog(FaultyLogStore(SqliteLogStore(state), fail_when=first_t2)),
            artifacts=MemoryArtifactStore(),
            state_dir=state,
        ),
        workspace=ws,
    )
    with pytest.raises(CommitFailedError):
        await agent.run("pay", session="s1")
    await agent.close()
    return tmp_path


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_recover_decide_resume(interrupted: Path) -> None:
    state = str(interrupted / "state")
    tools = str(interrupted / "tools.py")
    assert (interrupted / "charges.txt").read_text() == "5\n"

    code, out, _ = cli("sessions", "--state", state, "--json")
    assert code == 0
    assert json.loads(out)["sessions"][0]["last_status"] == "interrupted"

    code, out, _ = cli("recover", "s1", "--state", state)
    assert code == 0
    assert "call-0-1" in out
    assert "indeterminate" in out
    assert "park for an operator decision" in out
    assert "resume will park 1 call(s)" in out
    code, out, _ = cli("recover", "s1", "--state", state, "--json")
    plan = json.loads(out)
    assert [(c["call_id"], c["action"]) for c in plan["calls"]] == [("call-0-1", "park")]

    code, out, err = cli("resume", "s1", "--state", state, "--tools", tools)
    assert code == 3
    assert "call-0-1" in err
    assert "lodger decide s1 call-0-1" in err

    code, _, err = cli("decide", "s1", "call-0-1", "--state", state)
    assert code == 2
    assert "--completed" in err

    code, out, _ = cli(
        "decide", "s1", "call-0-1", "--completed", "--result", '"charged 5"', "--state", state
    )
    assert code == 0
    assert "recorded: call-0-1 completed" in out

    code, out, err = cli("resume", "s1", "--state", state, "--tools", tools)
    assert code == 0, err
    assert "turn completed" in out
    assert (interrupted / "charges.txt").read_text() == "5\n"  # never charged twice

    code, out, _ = cli("log", "verify", "s1", "--state", state)
    assert code == 0
    code, out, _ = cli("recover", "s1", "--state", state)
    assert "no interrupted turn" in out


def test_resume_needs_the_same_tools(interrupted: Path) -> None:
    code, _, err = cli("resume", "s1", "--state", str(interrupted / "state"))
    assert code == 3
    assert "not bound now: charge" in err
    assert "lodger resume --tools FILE.py" in err  # the hint names the flag that binds them


@pytest.fixture
async def scripted_in_code(tmp_path: Path) -> Path:
    """A session interrupted after T1 whose model was a ScriptedModel built in code."""
    (tmp_path / "tools.py").write_text(TOOLS)
    state = tmp_path / "state"
    agent = Agent(
        model=ScriptedModel(SCRIPT),  # recorded as script:inline: no file the CLI can open
        tools=load_tools_file(str(tmp_path / "tools.py")),
        storage=Storage(
            log=EventLog(FaultyLogStore(SqliteLogStore(state), fail_when=first_t2)),
            artifacts=MemoryArtifactStore(),
            state_dir=state,
        ),
    )
    with pytest.raises(CommitFailedError):
        await agent.run("pay", session="s1")
    await agent.close()
    return tmp_path


def test_a_session_scripted_in_code_names_the_model_flag_on_resume(
    scripted_in_code: Path,
) -> None:
    state, tools = str(scripted_in_code / "state"), str(scripted_in_code / "tools.py")
    code, _, err = cli("resume", "s1", "--state", state, "--tools", tools)
    assert code == 2, err
    assert "script inline does not exist" in err
    assert "pass --model script:FILE.json" in err
    assert (scripted_in_code / "charges.txt").read_text() == "5\n"  # nothing ran again


def test_a_runner_keeps_nothing_a_command_retained(
    interrupted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recover`` and ``resume`` keep their opened sessions until the process leaves
    (``retain_until_exit``: os._exit frees nothing); a caller that runs commands in its
    own process (a test runner, an embedding) gets them freed when each returns."""
    import lodger.cli._recover as recover_module
    from lodger.cli import _common

    state = str(interrupted / "state")
    seen: list[int] = []
    keep = _common.retain_until_exit

    def spy(value: object) -> None:
        keep(value)
        seen.append(len(_common._RETAINED))

    monkeypatch.setattr(recover_module, "retain_until_exit", spy)
    code, out, _ = cli("recover", "s1", "--state", state)
    assert code == 0 and "call-0-1" in out
    code, _, err = cli("resume", "s1", "--state", state)  # refused: no charge tool
    assert code != 0, err
    assert seen == [1, 1], seen  # each command kept its own, and it was freed after
    assert _common._RETAINED == []


def test_a_decision_at_the_terminal_names_the_cli_user(interrupted: Path) -> None:
    state = str(interrupted / "state")
    user = pwd.getpwuid(os.getuid()).pw_name
    code, out, err = cli("decide", "s1", "call-0-1", "--not-applied", "--state", state)
    assert code == 0, err
    code, out, _ = cli("log", "show", "s1", "--state", state, "--json")
    assert code == 0
    events = json.loads(out)["events"]
    decisions = [e["body"] for e in events if e["body"]["kind"] == "operator_decision"]
    assert [(d["decision"], d["by"], d["who"]) for d in decisions] == [
        ("not_applied", "operator", f"cli:{user}")
    ]
    code, out, _ = cli("log", "show", "s1", "--state", state)
    assert code == 0
    assert f"not_applied by operator cli:{user}" in out
