"""FallbackModel in a run: the first provider's loopback server fails, the second answers.
Retries apply per model, then the step switches (a ``model_switched`` fact before the
step's output); a failure that is the request's fault does not switch; the log verifies.
Also models by name: ``Agent(model="...")``, ``a|b`` specs and the project file's list."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_dialects import ANTHROPIC, OPENAI_CHAT
from wire_server import Fail, WireServer, closed_port

from lodger import Agent, FallbackModel, Retries
from lodger.cli import main
from lodger.errors import ConfigError, RateLimitedError, UsageError
from lodger.events import Event, ModelOutput, ModelSwitched, ProviderRetried, StepStarted
from lodger.providers import TestModel, make_model
from lodger.providers.anthropic import AnthropicModel
from lodger.providers.openai_chat import OpenAIChatModel
from lodger.runtime.composition import compose
from lodger.runtime.project import Project
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools import tool


@tool(recovery="idempotent")
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def _no_wait(_: float) -> None:
    return None


RETRIES = Retries(max_retries=1, sleep=_no_wait, jitter=lambda: 0.0)


@pytest.fixture
def servers() -> Iterator[tuple[WireServer, WireServer]]:
    with WireServer() as first, WireServer() as second:
        yield first, second


def _kinds(events: list[Event]) -> list[str]:
    return [e.body.kind for e in events]


async def _run(agent: Agent, task: str = "go") -> tuple[object, list[Event]]:
    result = await agent.run(task)
    await agent.log.verify(result.session_id)
    return result, await agent.log.read_all(result.session_id)


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_failing_first_model_hands_the_step_to_the_next(
    tmp_path: Path, servers: tuple[WireServer, WireServer], status: int
) -> None:
    first, second = servers
    first.push(*[Fail(status, {"error": {"message": "down"}})] * 2)  # the try and its retry
    second.push(ANTHROPIC.answer("from the second"))
    chain = FallbackModel(OPENAI_CHAT.model(first), ANTHROPIC.model(second))
    async with Agent(model=chain, storage=tmp_path, retries=RETRIES) as agent:
        result, events = await _run(agent)
    await chain.aclose()

    assert result.status == "completed"  # type: ignore[attr-defined]
    assert result.answer == "from the second"  # type: ignore[attr-defined]
    assert len(first.requests) == 2  # retries apply to the first model before the switch
    assert len(second.requests) == 1
    kinds = _kinds(events)
    step = kinds[kinds.index("step_started") + 1 :]
    assert step[:3] == ["provider_retried", "model_switched", "model_output"]
    [switch] = [e.body for e in events if isinstance(e.body, ModelSwitched)]
    assert switch.from_model == OPENAI_CHAT.model(first).spec
    assert switch.to_model == "anthropic:claude-test"
    assert f"HTTP {status}" in switch.error and "gave up after 1 retries" in switch.error
    [started] = [e.body for e in events if isinstance(e.body, StepStarted)]
    assert started.model == chain.spec  # the chain; the switch says who answered


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_request_at_fault_does_not_fall_back(
    tmp_path: Path, servers: tuple[WireServer, WireServer], status: int
) -> None:
    first, second = servers
    first.push(Fail(status, {"error": {"message": "bad request"}}))
    chain = FallbackModel(OPENAI_CHAT.model(first), ANTHROPIC.model(second))
    async with Agent(model=chain, storage=tmp_path, retries=RETRIES) as agent:
        result, events = await _run(agent)
    await chain.aclose()

    assert result.status == "failed"  # type: ignore[attr-defined]
    assert f"HTTP {status}" in (result.error or "")  # type: ignore[attr-defined]
    assert second.requests == []
    assert not any(isinstance(e.body, ModelSwitched | ProviderRetried) for e in events)


async def test_an_unreachable_first_model_falls_back(
    tmp_path: Path, servers: tuple[WireServer, WireServer]
) -> None:
    _, second = servers
    second.push(ANTHROPIC.answer("reached"))
    gone = OpenAIChatModel(
        model="gpt-chat", base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="sk"
    )
    chain = FallbackModel(gone, ANTHROPIC.model(second))
    async with Agent(model=chain, storage=tmp_path, retries=RETRIES) as agent:
        result, events = await _run(agent)
    await chain.aclose()
    assert result.answer == "reached"  # type: ignore[attr-defined]
    [switch] = [e.body for e in events if isinstance(e.body, ModelSwitched)]
    assert "cannot reach the provider" in switch.error


async def test_fallback_on_narrows_which_failures_switch(
    tmp_path: Path, servers: tuple[WireServer, WireServer]
) -> None:
    first, second = servers
    first.push(*[Fail(500, {"error": {"message": "down"}})] * 2)
    chain = FallbackModel(
        OPENAI_CHAT.model(first), ANTHROPIC.model(second), fallback_on=(RateLimitedError,)
    )
    async with Agent(model=chain, storage=tmp_path, retries=RETRIES) as agent:
        result, _ = await _run(agent)
    await chain.aclose()
    assert result.status == "failed"  # type: ignore[attr-defined]
    assert second.requests == []


async def test_each_step_starts_again_from_the_first_model_and_keeps_the_history(
    tmp_path: Path, servers: tuple[WireServer, WireServer]
) -> None:
    """Step 1: the chat model is down, Anthropic (thinking on) calls a tool. Step 2: the
    chat model is back and answers, seeing Anthropic's call with its id, and none of its
    signed thinking. Step 3 of the next turn: chat fails after its own call, and Anthropic
    takes over a tool loop it did not start: asked without thinking, which the API
    refuses when the calls' turn holds no thinking block."""
    first, second = servers
    first.push(*[Fail(502, {"error": {"message": "bad gateway"}})] * 2)
    second.push(ANTHROPIC.call("toolu_1", "lookup", {"key": "a"}))
    first.push(OPENAI_CHAT.answer("a is known"))
    chain = FallbackModel(OPENAI_CHAT.model(first), ANTHROPIC.model(second))
    async with Agent(model=chain, storage=tmp_path, tools=[lookup], retries=RETRIES) as agent:
        result = await agent.run("what is a?")
        assert result.answer == "a is known"
        answered = first.requests[-1].body
        assert OPENAI_CHAT.history(answered)[1:] == [
            ("call", "toolu_1", "lookup"),
            ("result", "toolu_1", "value of a"),
        ]
        assert ANTHROPIC.state_marker not in json.dumps(answered)

        first.push(OPENAI_CHAT.call("call_b", "lookup", {"key": "b"}))
        first.push(*[Fail(500, {"error": {"message": "down"}})] * 2)
        second.push(ANTHROPIC.answer("b is known"))
        again = await agent.run("and b?", session=result.session_id)
        assert again.answer == "b is known"
        await agent.log.verify(result.session_id)
        events = await agent.log.read_all(result.session_id)
    await chain.aclose()
    took_over = second.requests[-1].body
    assert second.requests[0].body["thinking"]["type"] == "enabled"  # its own step thinks
    assert "thinking" not in took_over
    assert ANTHROPIC.history(took_over)[-2:] == [
        ("call", "call_b", "lookup"),
        ("result", "call_b", "value of b"),
    ]
    switches = [e.body for e in events if isinstance(e.body, ModelSwitched)]
    assert [(s.from_model, s.to_model) for s in switches] == [
        (chain.models[0].spec, "anthropic:claude-test")
    ] * 2
    outputs = [e for e in events if isinstance(e.body, ModelOutput)]
    assert len(outputs) == 4


async def test_a_chain_by_name_from_the_project_file(
    tmp_path: Path, servers: tuple[WireServer, WireServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = servers
    monkeypatch.setenv("ANTHROPIC_BASE_URL", second.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.delenv("LODGER_THINKING_BUDGET", raising=False)
    chat = f"openai-compatible:{first.base_url}/v1#gpt-chat"
    (tmp_path / "lodger.toml").write_text(f'model = ["{chat}", "anthropic:claude-b"]\n')
    project = Project.load(tmp_path, trusted=True)
    assert project.model == f"{chat}|anthropic:claude-b"
    binding = compose(project)
    assert isinstance(binding.model, FallbackModel)
    first.push(*[Fail(500, {"error": {"message": "down"}})] * 2)
    second.push(ANTHROPIC.answer("by name"))
    storage = Storage.local(tmp_path / "state")
    async with Agent(model=project.model or "", storage=storage, retries=RETRIES) as agent:
        result, events = await _run(agent)
        made = agent.model
    assert result.answer == "by name"  # type: ignore[attr-defined]
    assert any(isinstance(e.body, ModelSwitched) for e in events)
    assert isinstance(made, FallbackModel)
    assert all(m._client.is_closed() for m in made.models)  # type: ignore[attr-defined]
    await binding.model.aclose()
    await storage.close()


def test_specs_with_a_bar_are_a_fallback_chain(tmp_path: Path) -> None:
    script = tmp_path / "steps.json"
    script.write_text('[{"text": "hi"}]')
    chain = make_model(f"test | script:{script}")
    assert isinstance(chain, FallbackModel)
    assert [m.spec for m in chain.models] == ["test:test", f"script:{script}"]
    assert chain.spec == f"test:test|script:{script}"
    assert make_model(chain.spec).spec == chain.spec  # a resumed session reads it back
    nested = FallbackModel(chain, TestModel())
    assert [m.spec for m in nested.models] == ["test:test", f"script:{script}", "test:test"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("test||test", "empty model"),
        ("test|", "empty model"),
        ("test|test", "same model twice"),
        ("test|nope", "no provider prefix"),
        ("test|bogus:x", "unknown model provider"),
    ],
)
def test_a_bad_chain_is_a_config_error(spec: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        make_model(spec)


def test_a_chain_needs_two_models() -> None:
    with pytest.raises(UsageError, match="at least two"):
        FallbackModel(TestModel())


async def test_agent_takes_a_model_by_name_and_closes_it(
    tmp_path: Path, servers: tuple[WireServer, WireServer]
) -> None:
    first, _ = servers
    async with Agent(model="test", storage=tmp_path / "a") as agent:
        assert isinstance(agent.model, TestModel)
        result = await agent.run("hello")
    assert result.status == "completed"
    first.push(OPENAI_CHAT.answer("named"))
    agent = Agent(model=f"openai-compatible:{first.base_url}/v1#gpt-chat", storage=tmp_path / "b")
    assert (await agent.run("hi")).answer == "named"
    made = agent.model
    assert isinstance(made, OpenAIChatModel)
    await agent.close()
    assert made._client.is_closed()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no provider prefix"):
        Agent(model="gpt-4.1", storage=tmp_path / "c")


async def test_a_model_given_as_an_object_stays_open(tmp_path: Path) -> None:
    claude = AnthropicModel(model="claude-x", base_url="http://127.0.0.1:9", api_key="k")
    async with Agent(model=claude, storage=tmp_path):
        pass
    assert not claude._client.is_closed()
    await claude.aclose()


def test_the_cli_takes_a_chain_and_shows_the_switch(
    tmp_path: Path, servers: tuple[WireServer, WireServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    first, second = servers
    # a rate limit the provider will not lift soon: given up at once, then switched
    first.push(Fail(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "3600"}))
    second.push(OPENAI_CHAT.answer("from the second"))
    chain = "|".join(f"openai-compatible:{s.base_url}/v1#gpt-chat" for s in servers)
    (tmp_path / "ws").mkdir()
    state = str(tmp_path / "state")
    places = ["--workspace", str(tmp_path / "ws"), "--state", state, "--session", "f1"]
    ran = CliRunner().invoke(main, ["run", "hi", "--model", chain, *places])
    assert ran.exit_code == 0, ran.output
    assert "from the second" in ran.output
    switched = f"{chain.split('|')[0]} failed; {chain.split('|')[1]} takes over"
    assert switched in " ".join(ran.output.split())
    shown = CliRunner().invoke(main, ["log", "show", "f1", "--state", state, "--json"])
    bodies = [e["body"] for e in json.loads(shown.stdout)["events"]]
    [switch] = [b for b in bodies if b["kind"] == "model_switched"]
    assert "gave up at once" in switch["error"]
    assert [b["model"] for b in bodies if b["kind"] == "run_started"] == [chain]
    verified = CliRunner().invoke(main, ["log", "verify", "f1", "--state", state])
    assert verified.exit_code == 0, verified.output


async def test_sessions_take_a_binding_by_name(
    tmp_path: Path, servers: tuple[WireServer, WireServer]
) -> None:
    first, second = servers
    # a rate limit too long to wait for: given up at once, so no backoff to sit through
    first.push(Fail(429, {"error": {"message": "slow"}}, headers={"Retry-After": "3600"}))
    second.push(OPENAI_CHAT.answer("bound by name"))
    chain = "|".join(f"openai-compatible:{s.base_url}/v1#gpt-chat" for s in servers)
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:
        result = await sessions.run("hi", binding=Binding(model=chain))
        assert result.answer == "bound by name"
        defaults = await sessions.defaults(result.session_id)
    assert defaults.model == chain  # what a resume makes again
    with pytest.raises(ConfigError, match="unknown model provider"):
        async with Sessions(Storage.local(tmp_path / "state")) as sessions:
            await sessions.run("hi", binding=Binding(model="nope:x"))
