"""Usage limits and budgets from ``lodger.toml`` (``[limits]``, ``[budgets]``), the flags
of ``lodger run`` / ``lodger resume``, and the one composition: an untrusted project may
only lower them and sets no price. ``lodger log show`` names the reached budget."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main
from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.prices import ModelPrice
from lodger.errors import ConfigError
from lodger.providers import ScriptedModel
from lodger.runtime import Overrides, Project, compose

FILE = """
[limits]
max_steps = 10
request_limit = 4
tool_calls_limit = 6
[budgets]
session_usd = 2.5
daily_usd = 20
[budgets.prices."openai:my-tune"]
input = 1.0
cached_input = 0.25
output = 4.0
"""

MODEL = ScriptedModel([{"text": "hi"}])


def _project(tmp_path: Path, text: str, *, trusted: bool) -> Project:
    (tmp_path / "lodger.toml").write_text(text)
    return Project.load(tmp_path, trusted=trusted)


def test_a_trusted_file_sets_limits_budgets_and_prices(tmp_path: Path) -> None:
    project = _project(tmp_path, FILE, trusted=True)
    binding = compose(project, Overrides(model=MODEL))
    assert binding.usage == UsageLimits(request_limit=4, tool_calls_limit=6)
    assert binding.budgets.micro("session_usd") == 2_500_000
    assert binding.budgets.micro("daily_usd") == 20_000_000
    assert binding.budgets.micro("tree_usd") is None
    assert binding.budgets.prices.price("openai:my-tune") == ModelPrice.of(1, "0.25", 4)
    assert binding.budgets.prices.price("openai:gpt-4.1") == ModelPrice.of(2, "0.5", 8)
    # a flag wins over the file for what it sets; the rest stays the file's
    flagged = compose(
        project,
        Overrides(
            model=MODEL,
            usage=UsageLimits(request_limit=40),
            budgets=Budgets(session_usd=9),
        ),
    )
    assert flagged.usage == UsageLimits(request_limit=40, tool_calls_limit=6)
    assert flagged.budgets.micro("session_usd") == 9_000_000
    assert flagged.budgets.micro("daily_usd") == 20_000_000
    assert flagged.budgets.prices.price("openai:my-tune") == ModelPrice.of(1, "0.25", 4)


def test_an_untrusted_file_only_lowers_and_sets_no_price(tmp_path: Path) -> None:
    project = _project(tmp_path, FILE, trusted=False)
    assert any("budgets.prices" in line for line in project.ignored)
    alone = compose(project, Overrides(model=MODEL))
    assert alone.usage.request_limit == 4  # lower than no limit at all
    with pytest.raises(ConfigError, match="no price for model 'openai:my-tune'"):
        alone.budgets.prices.price("openai:my-tune")
    raised = compose(
        project,
        Overrides(
            model=MODEL,
            usage=UsageLimits(request_limit=40, tool_calls_limit=2),
            budgets=Budgets(session_usd=9, tree_usd=1),
        ),
    )
    assert raised.usage == UsageLimits(request_limit=4, tool_calls_limit=2)
    assert raised.budgets.micro("session_usd") == 2_500_000
    assert raised.budgets.micro("tree_usd") == 1_000_000


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[limits]\nrequest_limit = -1\n", "request_limit must be a whole number"),
        ("[budgets]\nsession_usd = -2\n", "session_usd must be an amount"),
        ("[budgets]\nweekly_usd = 2\n", "unknown key 'budgets.weekly_usd'"),
        ('[budgets.prices."openai:x"]\ninput = 1\n', "budgets.prices.openai:x.output"),
        ('[budgets.prices."openai:x"]\ninput = 1\noutput = -1\n', "output must be a price"),
    ],
)
def test_a_bad_limit_or_budget_is_a_config_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _project(tmp_path, text, trusted=True)


SCRIPT = [
    {"calls": [{"name": "list_files", "args": {}}]},
    {"text": "all done"},
]


def test_run_parks_on_a_flag_and_resume_with_a_raised_one_finishes(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    common = ["--model", f"script:{tmp_path / 'script.json'}", "--state", str(state)]
    runner = CliRunner()
    run = runner.invoke(
        main,
        ["run", "list", *common, "--workspace", str(ws), "--session", "s1", "--request-limit", "1"],
    )
    assert run.exit_code == 3, run.output
    assert "turn parked" in run.output and "request_limit" in run.output
    assert "lodger resume s1" in run.output
    shown = runner.invoke(main, ["log", "show", "s1", "--state", str(state)])
    assert shown.exit_code == 0, shown.output
    assert "budget reached requests" in shown.output and "parked" in shown.output
    plan = runner.invoke(main, ["recover", "s1", "--state", str(state)])
    assert "parked: the requests budget" in plan.output and "ready:" not in plan.output
    plan_json = runner.invoke(main, ["recover", "s1", "--state", str(state), "--json"])
    assert json.loads(plan_json.output)["budget"]["limit"] == 1
    again = runner.invoke(main, ["resume", "s1", *common, "--request-limit", "1"])
    assert again.exit_code == 3, again.output
    as_json = runner.invoke(
        main,
        ["run", "again", *common, "--workspace", str(ws), "--session", "s1", "--json",
         "--request-limit", "1"],
    )  # fmt: skip
    assert as_json.exit_code == 3, as_json.output  # a new turn resumes the parked one first
    lines = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    (last,) = [line for line in lines if line.get("type") == "result"]
    assert last["status"] == "parked" and last["budget"]["budget"] == "requests"
    done = runner.invoke(main, ["resume", "s1", *common, "--request-limit", "2"])
    assert done.exit_code == 0, done.output
    assert "turn completed" in done.output


def test_budget_flags_become_overrides() -> None:
    from lodger.cli._run import budget_overrides

    assert budget_overrides({"request_limit": None, "session_usd": None}) == {}
    out = budget_overrides({"total_tokens_limit": 5, "tree_usd": 0.25})
    assert out["usage"] == UsageLimits(total_tokens_limit=5)
    assert out["budgets"].micro("tree_usd") == 250_000
    assert Decimal(str(out["budgets"].tree_usd)) == Decimal("0.25")


def test_a_worker_binds_its_budget_flags_over_the_restored_project(tmp_path: Path) -> None:
    from lodger.cli._control import _Binder
    from lodger.cli._run import budget_overrides

    (tmp_path / "lodger.toml").write_text(FILE)  # restored: untrusted, it only lowers
    bind = _Binder(
        trust_projects=False,
        model_spec="test",
        tools=[],
        subagents=None,
        spans=None,
        budgets=budget_overrides({"request_limit": 9, "tree_usd": 3}),
    )
    binding = bind("s1", None, tmp_path)
    assert binding.usage == UsageLimits(request_limit=4, tool_calls_limit=6)
    assert binding.budgets.micro("tree_usd") == 3_000_000
    assert binding.budgets.micro("session_usd") == 2_500_000


def test_a_limit_raised_in_lodger_toml_resumes_the_parked_turn(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    common = ["--model", f"script:{tmp_path / 'script.json'}", "--state", str(tmp_path / "st")]
    common += ["--workspace", str(ws), "--trust"]
    runner = CliRunner()
    (ws / "lodger.toml").write_text("[limits]\nrequest_limit = 1\n")
    parked = runner.invoke(main, ["run", "list", *common, "--session", "s1"])
    assert parked.exit_code == 3 and "request_limit" in parked.output, parked.output
    (ws / "lodger.toml").write_text("[limits]\nrequest_limit = 2\n")
    done = runner.invoke(main, ["resume", "s1", *common])
    assert done.exit_code == 0 and "turn completed" in done.output, done.output
