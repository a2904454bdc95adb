"""The everyday CLI: lodger.toml (model, permission rules, unknown keys), distinct exit
codes, ``--last`` and id prefixes, and a demo whose state can be found again. Each runs
the real ``lodger`` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lodger import Agent, ScriptedModel

TOOLS = '''
from lodger import tool

@tool(approval=True)
def launch(target: str) -> str:
    """Launch something (asks for approval)."""
    return "launched " + target
'''


def lodger(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "tools.py").write_text(TOOLS)
    calls = [
        {"name": "launch", "args": {"target": "rocket"}},
        {"name": "launch", "args": {"target": "nukes"}},
    ]
    script = [{"calls": calls}, {"text": "done"}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    return tmp_path


def results(cwd: Path, state: Path, session: str) -> dict[str, str]:
    """What each call's last fact says (its T2 content or its rejection message)."""
    shown = lodger("log", "show", session, "--state", state, "--json", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    events = data["events"] if isinstance(data, dict) else data
    return {
        e["call_id"]: e["body"].get("content") or e["body"].get("message")
        for e in events
        if e["body"]["kind"] in ("tool_responded", "call_rejected")
    }


@pytest.mark.slow
def test_toml_model_and_permission_rules_with_argument_patterns(project: Path) -> None:
    (project / "lodger.toml").write_text(
        'model = "script:script.json"\n'
        "[permissions]\n"
        'allow = ["launch(rocket)"]\n'
        'deny = ["launch(nuke*)"]\n'
    )
    state = project / "state"
    untrusted = lodger(
        "run", "go", "--tools", "tools.py", "--session", "s0", "--state", state, cwd=project
    )
    # a file nobody trusted names no model and allows nothing (it only narrows)
    assert untrusted.returncode == 2, untrusted.stderr
    assert "is not trusted" in untrusted.stderr and "lodger trust" in untrusted.stderr
    assert "no model given" in untrusted.stderr
    trusted = lodger("trust", cwd=project)
    assert trusted.returncode == 0 and trusted.stdout.startswith("trusted: "), trusted.stderr
    ran = lodger(
        "run", "go", "--tools", "tools.py", "--session", "s1", "--state", state, cwd=project
    )
    assert ran.returncode == 0, ran.stderr  # the model came from lodger.toml
    outcomes = results(project, state, "s1")
    assert outcomes["call-0-1"] == "launched rocket"  # allowed by rule, not asked
    assert "denied by policy" in outcomes["call-0-2"]


@pytest.mark.slow
def test_without_a_rule_the_denial_names_the_allow_rule_lodger_toml_accepts(
    project: Path,
) -> None:
    state = project / "state"
    ran = lodger(
        "run", "go", "--model", "script:script.json", "--tools", "tools.py",
        "--session", "s1", "--state", state, cwd=project,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    message = results(project, state, "s1")["call-0-1"]
    assert '[permissions] allow = ["launch"] in lodger.toml' in message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('modle = "x"\n', "'modle'"),
        ('[permissions]\nalow = ["x"]\n', "'permissions.alow'"),
        ("[sandboxx]\nnetwork = true\n", "'sandboxx'"),
    ],
)
def test_unknown_keys_anywhere_in_lodger_toml_are_usage_errors_naming_the_key(
    project: Path, toml: str, key: str
) -> None:
    (project / "lodger.toml").write_text(toml)
    ran = lodger("run", "go", "--model", "script:script.json", "--state", "st", cwd=project)
    assert ran.returncode == 2
    assert f"unknown key {key}" in ran.stderr and "Traceback" not in ran.stderr


@pytest.mark.slow
def test_exit_codes_are_documented_and_not_found_is_distinct(tmp_path: Path) -> None:
    helped = lodger("--help", cwd=tmp_path)
    for line in ("2    usage error", "3    blocked", "4    not found", "130  interrupted"):
        assert line in helped.stdout
    missing = lodger("log", "verify", "nope", "--state", tmp_path / "st", cwd=tmp_path)
    assert missing.returncode == 4
    usage = lodger("log", "verify", "--state", tmp_path / "st", cwd=tmp_path)
    assert usage.returncode == 2 and "--last" in usage.stderr


@pytest.mark.slow
def test_last_and_unique_prefixes_name_sessions(project: Path) -> None:
    state = project / "state"
    with Agent(model=ScriptedModel([{"text": "ok"}]), storage=state) as agent:
        for session in ("alpha-1", "alpha-2", "beta-1"):  # beta-1 is the latest
            assert agent.run_sync("go", session=session).status == "completed"
    by_prefix = lodger("log", "verify", "bet", "--state", state, "--json", cwd=project)
    assert by_prefix.returncode == 0 and "beta-1" in by_prefix.stdout
    ambiguous = lodger("recover", "alpha", "--state", state, cwd=project)
    assert ambiguous.returncode == 2 and "alpha-1, alpha-2" in ambiguous.stderr
    last = lodger("log", "verify", "--last", "--state", state, "--json", cwd=project)
    assert last.returncode == 0 and "beta-1" in last.stdout


@pytest.mark.slow
def test_the_demo_says_how_to_list_its_sessions(tmp_path: Path) -> None:
    demo = lodger("demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    listed = next(line for line in demo.stdout.splitlines() if line.startswith("list:"))
    state = listed.split("--state ")[1].split()[0]
    sessions = lodger("sessions", "--state", state, "--json", cwd=tmp_path)
    assert sessions.returncode == 0 and len(json.loads(sessions.stdout)["sessions"]) == 1
