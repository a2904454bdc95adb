"""Prompt-cache tokens add up: in a turn's ``RunUsage`` (with the hit rate), per turn and
per session in ``lodger log show``, and in a subagent's outcome."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger import Agent, FunctionModel
from lodger.cli import main
from lodger.events import Usage
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.runtime.subagents.link import child_outcome


def cached_model() -> FunctionModel:
    def step(request: ModelRequest) -> ModelResponse:
        usage = Usage(
            input_tokens=1000, output_tokens=20, cache_read_tokens=750, cache_write_tokens=100
        )
        return ModelResponse(text="ok", usage=usage)

    return FunctionModel(step)


def test_run_usage_sums_cache_tokens_and_the_hit_rate(tmp_path: Path) -> None:
    with Agent(model=cached_model(), storage=tmp_path / "state") as agent:
        result = agent.run_sync("one", session="s")
        agent.run_sync("two", session="s")
        events = agent._sync_runner().run(agent.session("s").events())
    assert result.usage.cache_read_tokens == 750 and result.usage.cache_write_tokens == 100
    assert result.usage.cache_hit_rate == 0.75
    outcome = child_outcome("s", events)  # as a parent reads its child's log
    assert (outcome.cache_read_tokens, outcome.cache_write_tokens) == (750, 100)
    assert json.loads(outcome.render())["cache_read_tokens"] == 750

    state = str(tmp_path / "state")
    per_turn = "usage: 1,000 in (750 from cache: 75% hit; 100 written), 20 out over 1 model call"
    page = CliRunner().invoke(main, ["log", "show", "s", "--state", state])  # the last turn
    assert page.output.count(per_turn) == 1
    assert "usage of the turns shown: 1,000 in (750 from cache" in page.output
    shown = CliRunner().invoke(main, ["log", "show", "s", "--state", state, "--all"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count(per_turn) == 2
    assert (
        "session usage: 2,000 in (1,500 from cache: 75% hit; 200 written), 40 out over 2 "
        "model calls" in shown.output
    )
    as_json = CliRunner().invoke(main, ["log", "show", "s", "--state", state, "--json", "--all"])
    usage = json.loads(as_json.output)["usage"]
    assert usage["cache_read_tokens"] == 1500 and usage["cache_hit_rate"] == 0.75


def test_no_cache_part_when_the_provider_reported_none(tmp_path: Path) -> None:
    model = FunctionModel(
        lambda r: ModelResponse(text="ok", usage=Usage(input_tokens=10, output_tokens=2))
    )
    with Agent(model=model, storage=tmp_path / "state") as agent:
        result = agent.run_sync("one", session="s")
    assert result.usage.cache_hit_rate == 0.0
    shown = CliRunner().invoke(main, ["log", "show", "s", "--state", str(tmp_path / "state")])
    assert "usage: 10 in, 2 out over 1 model call" in shown.output
    assert "from cache" not in shown.output
