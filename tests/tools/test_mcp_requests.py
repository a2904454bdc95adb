"""What MCP servers ask lodger while their tools run: elicitation, sampling, roots.

Against real servers launched as subprocesses: ``tests/mcp_servers/asking_server.py``
(ours, on the official Python SDK: a password field, a URL, a sampling loop, roots) and
``@modelcontextprotocol/server-everything`` (the reference TypeScript server).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lodger.engine.budgets import UsageLimits
from lodger.engine.settings import Hooks, Limits, Services
from lodger.errors import ToolCallError
from lodger.events import (
    ElicitationAnswered,
    ElicitationRequested,
    Event,
    ProposedCall,
    SamplingAnswered,
    SamplingRequested,
    ToolResponded,
    ToolsChanged,
    Usage,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools.mcp import McpServerConfig, McpServers
from lodger.tools.spec import Elicitation, ElicitationReply, Elicitor

SERVERS = Path(__file__).parent.parent / "mcp_servers"
ASKING = str(SERVERS / "asking_server.py")
EVERYTHING = SERVERS / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"


def asking(**options: Any) -> McpServerConfig:
    return McpServerConfig(name="ask", command=sys.executable, args=(ASKING,), **options)


class Script:
    """A model that calls ``calls`` one per step (after selecting them), then answers;
    a request without tools (a sampling request) is answered with its last message."""

    def __init__(
        self, calls: Sequence[tuple[str, dict[str, Any]]], select: Sequence[str] = ()
    ) -> None:
        self.calls = list(calls)
        self.select = list(select) or sorted({name for name, _ in self.calls})
        self.requests: list[ModelRequest] = []
        self.samples: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if not request.tools:  # what a server asked for
            self.samples.append(request)
            text = getattr(request.messages[-1], "text", "")
            return ModelResponse(
                text=f"answer to {text}", usage=Usage(input_tokens=7, output_tokens=3)
            )
        self.requests.append(request)
        step = len(self.requests) - 1
        names = ",".join(self.select)
        if step == 0:
            query = json.dumps({"query": f"select:{names}"})
            return ModelResponse(
                calls=(ProposedCall(call_id="find", name="tool_search", arguments=query),)
            )
        if step <= len(self.calls):
            name, arguments = self.calls[step - 1]
            call = ProposedCall(call_id=f"c{step}", name=name, arguments=json.dumps(arguments))
            return ModelResponse(calls=(call,))
        return ModelResponse(text="done")

    def result(self, call_id: str) -> ToolResultMessage:
        for request in self.requests:
            for m in request.messages:
                if isinstance(m, ToolResultMessage) and m.call_id == call_id:
                    return m
        raise AssertionError(f"no result for {call_id}")


async def run(
    tmp_path: Path,
    configs: Sequence[McpServerConfig],
    script: Script,
    *,
    elicitor: Elicitor | None = None,
    limits: Limits | None = None,
) -> list[Event]:
    async with McpServers(configs, workspace=tmp_path) as servers:
        agent = Agent(
            model=FunctionModel(script),
            tools=servers.tools(),
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            workspace=tmp_path,
            hooks=Hooks(elicitor=elicitor),
            limits=limits or Limits(),
            services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        )
        agent.registry.add_source(servers)  # a list_changed rebinds at the next step
        agent.registry.add_prompt_section(servers.updates)  # resources that changed
        result = await agent.run("go", session="s")
        events = await agent.session("s").events()
        await agent.close()
    assert result.status in ("completed", "parked"), result
    return events


def bodies(events: list[Event], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


async def test_a_form_answer_reaches_the_server_and_its_password_never_the_log(
    tmp_path: Path,
) -> None:
    asked: list[Elicitation] = []

    async def person(question: Elicitation) -> ElicitationReply:
        asked.append(question)
        return ElicitationReply(
            action="accept", content={"user": "ada", "password": "hunter2"}, who="cli:ada"
        )

    script = Script([("ask__sign_in", {})])
    events = await run(tmp_path, [asking()], script, elicitor=person)
    assert "action=accept user=ada password_length=7" in script.result("c1").content
    (question,) = asked
    assert question.mode == "form" and question.call_id == "c1"
    (requested,) = bodies(events, ElicitationRequested)
    (answered,) = bodies(events, ElicitationAnswered)
    assert requested.server == "ask" and requested.elicitation_id == answered.elicitation_id
    assert answered.content == {"user": "ada"} and answered.withheld == ("password",)
    assert answered.by == "user" and answered.who == "cli:ada"
    # the facts sit between the call's T1 and T2, and the secret is in no byte of the log
    kinds = [type(e.body).__name__ for e in events if e.call_id == "c1"]
    assert kinds.index("ElicitationRequested") > kinds.index("ToolDispatched")
    assert kinds.index("ElicitationAnswered") < kinds.index("ToolResponded")
    db = b"".join(p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert b"hunter2" not in db


async def test_an_answer_that_breaks_the_form_is_declined(tmp_path: Path) -> None:
    async def careless(question: Elicitation) -> ElicitationReply:
        return ElicitationReply(action="accept", content={"user": 3})

    script = Script([("ask__sign_in", {})])
    events = await run(tmp_path, [asking()], script, elicitor=careless)
    assert "action=decline" in script.result("c1").content
    (answered,) = bodies(events, ElicitationAnswered)
    assert answered.action == "decline" and answered.by == "policy"


@pytest.mark.slow
async def test_nobody_to_ask_declines_by_policy_and_a_slow_person_times_out(
    tmp_path: Path,
) -> None:
    script = Script([("ask__sign_in", {})])
    events = await run(tmp_path / "a", [asking()], script, elicitor=None)
    assert "action=decline" in script.result("c1").content
    assert [a.by for a in bodies(events, ElicitationAnswered)] == ["policy"]

    async def never(question: Elicitation) -> ElicitationReply:
        import asyncio

        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    script = Script([("ask__sign_in", {})])
    events = await run(tmp_path / "b", [asking(elicitation_timeout_s=0.2)], script, elicitor=never)
    assert "action=cancel" in script.result("c1").content
    assert [(a.action, a.by) for a in bodies(events, ElicitationAnswered)] == [
        ("cancel", "timeout")
    ]

    script = Script([("ask__sign_in", {})])
    events = await run(tmp_path / "c", [asking(elicitation="decline")], script, elicitor=never)
    assert [(a.action, a.by) for a in bodies(events, ElicitationAnswered)] == [
        ("decline", "policy")
    ]


async def test_a_url_goes_to_the_person_and_never_to_the_model(tmp_path: Path) -> None:
    shown: list[str | None] = []

    async def person(question: Elicitation) -> ElicitationReply:
        shown.append(question.url)
        return ElicitationReply(action="accept")

    script = Script([("ask__open_link", {})])
    events = await run(tmp_path, [asking()], script, elicitor=person)
    assert shown == ["https://auth.example.test/authorize?code=s3cr3t"]
    assert "action=accept" in script.result("c1").content
    (requested,) = bodies(events, ElicitationRequested)
    assert requested.mode == "url" and requested.url == shown[0]
    seen = json.dumps([repr(r) for r in script.requests])
    assert "s3cr3t" not in seen


async def test_sampling_is_refused_by_default_and_logged(tmp_path: Path) -> None:
    script = Script([("ask__think", {"times": 2})])
    events = await run(tmp_path, [asking()], script)
    assert "answered=0 refused=2" in script.result("c1").content
    assert script.samples == []  # the model was never asked
    asked = bodies(events, SamplingRequested)
    assert [a.decision for a in asked] == ["deny", "deny"]
    assert "refused by lodger's policy" in asked[0].reason
    assert bodies(events, SamplingAnswered) == []


async def test_allowed_sampling_is_answered_by_the_session_model_counted_and_limited(
    tmp_path: Path,
) -> None:
    script = Script([("ask__think", {"times": 6})])
    config = asking(sampling="allow", max_samplings=3, sampling_max_tokens=20)
    events = await run(tmp_path, [config], script)
    assert "answered=3 refused=3 last=" in script.result("c1").content
    assert [r.max_output_tokens for r in script.samples] == [20, 20, 20]
    assert script.samples[0].system == "answer briefly"
    asked = bodies(events, SamplingRequested)
    assert [a.decision for a in asked] == ["allow"] * 3 + ["deny"] * 3
    assert "more than 3 completions" in asked[-1].reason
    answered = bodies(events, SamplingAnswered)
    assert [a.content for a in answered] == [f"answer to question {n}" for n in range(3)]
    assert all(a.usage.input_tokens == 7 for a in answered)


async def test_sampling_counts_in_the_turn_budget(tmp_path: Path) -> None:
    """Each answered sampling is a request of the turn: a budget of 3 requests is reached
    by 2 steps and 1 sampling, so the turn parks before its third step."""
    script = Script([("ask__think", {"times": 1}), ("ask__think", {"times": 1})])
    limits = Limits(usage=UsageLimits(request_limit=3))
    events = await run(tmp_path, [asking(sampling="allow")], script, limits=limits)
    assert len(bodies(events, SamplingAnswered)) == 1
    assert len(script.requests) == 2  # tool_search, think: then the budget stops it


@pytest.mark.slow
async def test_roots_are_offered_only_by_policy(tmp_path: Path) -> None:
    script = Script([("ask__roots", {})])
    await run(tmp_path / "a", [asking()], script)
    assert "refused" in script.result("c1").content
    (tmp_path / "b").mkdir()
    script = Script([("ask__roots", {})])
    await run(tmp_path / "b", [asking(roots=True)], script)
    assert script.result("c1").content == (tmp_path / "b").resolve().as_uri()


@pytest.mark.slow
@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm ci in tests/mcp_servers")
async def test_server_everything_elicits_and_samples_through_lodger(tmp_path: Path) -> None:
    asked: list[Elicitation] = []

    async def person(question: Elicitation) -> ElicitationReply:
        asked.append(question)
        return ElicitationReply(
            action="accept",
            content={"name": "Ada", "check": True, "untitledMultipleSelectEnum": ["Piano"]},
        )

    config = McpServerConfig(
        name="every", command="node", args=(str(EVERYTHING), "stdio"), sampling="allow"
    )
    script = Script(
        [
            ("every__trigger-elicitation-request", {}),
            ("every__trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}),
        ]
    )
    events = await run(tmp_path, [config], script, elicitor=person)
    assert asked and asked[0].server == "every" and asked[0].mode == "form"
    assert "Ada" in script.result("c1").content
    (answered,) = bodies(events, ElicitationAnswered)
    assert answered.action == "accept" and answered.content["name"] == "Ada"
    assert [s.decision for s in bodies(events, SamplingRequested)] == ["allow"]
    assert "answer to" in script.result("c2").content
    assert all(not isinstance(e.body, ToolResponded) or e.body.status == "ok" for e in events)


async def test_a_changed_listing_rebinds_at_the_next_step_as_a_fact(tmp_path: Path) -> None:
    script = Script(
        [
            ("ask__grow", {"name": "alpha"}),
            ("tool_search", {"query": "select:ask__alpha"}),
            ("ask__alpha", {"text": "hi"}),
            ("ask__grow", {"name": "beta"}),
            ("ask__alpha", {"text": "again"}),
        ],
        select=["ask__grow"],
    )
    events = await run(tmp_path, [asking()], script)
    assert script.result("c3").content == "hi"  # bound from the step after the change
    assert "ask__alpha" in script.result("c5").content and script.result("c5").is_error
    changes = [(c.added, c.removed) for c in bodies(events, ToolsChanged)]
    assert changes == [(("ask__alpha",), ()), (("ask__beta",), ("ask__alpha",))]
    # the inventory the model reads names the new tool, from the step after
    assert "ask__beta" in script.requests[-1].system


async def test_a_storm_of_changes_relists_once_and_a_bad_schema_costs_one_tool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script(
        [
            ("ask__storm", {"times": 200}),
            ("tool_search", {"query": "select:ask__whole,ask__broken"}),
            ("ask__whole", {"text": "still fine"}),
            ("ask__broken", {}),
        ],
        select=["ask__storm"],
    )
    events = await run(tmp_path, [asking()], script)
    changes = bodies(events, ToolsChanged)
    assert len(changes) == 1, changes  # 200 notifications, one relisting before a step
    assert set(changes[0].added) == {"ask__whole", "ask__broken"}
    assert changes[0].unusable == ("ask__broken",)
    assert script.result("c3").content == "still fine"
    broken = script.result("c4")
    assert broken.is_error and "cannot be called" in broken.content
    assert "lodger cannot call this tool" not in script.result("c3").content


@pytest.mark.slow
async def test_a_server_that_dies_while_it_asks_ends_the_call_and_comes_back(
    tmp_path: Path,
) -> None:
    async def never(question: Elicitation) -> ElicitationReply:
        import asyncio

        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    script = Script([("ask__die_asking", {}), ("ask__think", {"times": 1})])
    events = await run(tmp_path, [asking()], script, elicitor=never)
    died = script.result("c1")
    assert died.is_error and "is not available" in died.content
    assert "answered=0 refused=1" in script.result("c2").content  # started again
    (requested,) = bodies(events, ElicitationRequested)
    # nothing of the dead call is committed after its T2
    t2 = next(e.offset for e in events if e.call_id == "c1" and isinstance(e.body, ToolResponded))
    late = [e for e in events if e.call_id == "c1" and e.offset > t2]
    assert late == []
    assert requested.server == "ask"


ARCHITECTURE = "demo://resource/static/document/architecture.md"


def everything(**options: Any) -> McpServerConfig:
    return McpServerConfig(name="every", command="node", args=(str(EVERYTHING), "stdio"), **options)


@pytest.mark.slow
@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm ci in tests/mcp_servers")
async def test_resources_are_deferred_tools_and_an_update_is_noted_at_the_next_step(
    tmp_path: Path,
) -> None:
    script = Script(
        [
            ("every__list_resources", {}),
            ("every__read_resource", {"uri": ARCHITECTURE}),
            ("every__read_resource", {"uri": "demo://resource/dynamic/text/7"}),
            ("every__subscribe_resource", {"uri": ARCHITECTURE}),
            ("every__toggle-subscriber-updates", {}),
            ("every__read_resource", {"uri": ARCHITECTURE}),
            ("every__read_resource", {"uri": "demo://nothing/here"}),
        ]
    )
    await run(tmp_path, [everything()], script)
    listing = script.result("c1").content
    assert ARCHITECTURE in listing and "resource templates" in listing
    assert "demo://resource/dynamic/text/{resourceId}" in listing
    assert "# Everything Server" in script.result("c2").content
    assert "demo://resource/dynamic/text/7" in script.result("c3").content
    assert "subscribed" in script.result("c4").content
    # the step after the update names the resource; the step after it was read does not
    noted = [ARCHITECTURE in r.system for r in script.requests]
    assert noted[6] and not noted[7], noted
    missing = script.result("c7")
    assert missing.is_error and "could not read" in missing.content


@pytest.mark.slow
@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm ci in tests/mcp_servers")
async def test_a_turn_starts_from_a_prompt_and_a_resource_through_sessions(
    tmp_path: Path,
) -> None:
    from lodger.runtime.sessions import Binding, Sessions
    from lodger.tools.mcp import McpInput, PromptRef, ResourceRef

    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return ModelResponse(text="sunny")

    given = McpInput(
        text="in one word",
        prompt=PromptRef(server="every", name="args-prompt", arguments={"city": "Oslo"}),
        resources=[ResourceRef(server="every", uri=ARCHITECTURE)],
    )
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:
        binding = Binding(model=FunctionModel(model), mcp=[everything()])
        result = await sessions.run(given, binding=binding, session="s")
        events = await sessions.storage.log.read("s")
    assert result.status == "completed"
    (started,) = [e.body for e in events if e.kind == "turn_started"]
    assert started.input.startswith("What's weather in Oslo?\n\nin one word\n\n[resource ")
    assert "# Everything Server" in started.input
    assert seen[0].messages[0].text == started.input  # type: ignore[union-attr]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _http_everything(port: int) -> Any:
    """server-everything over streamable HTTP on ``port``: a server of the handshake era,
    whose sessions live in its process."""
    import asyncio
    import os

    proc = await asyncio.create_subprocess_exec(
        "node", str(EVERYTHING), "streamableHttp",
        env={**os.environ, "PORT": str(port)}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    async with asyncio.timeout(30):
        while b"listening on port" not in await proc.stderr.readline():
            pass
    return proc


@pytest.mark.slow
@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm ci in tests/mcp_servers")
async def test_a_dropped_http_session_is_opened_again_by_the_next_call() -> None:
    """server-everything answers a session it does not know with 400 (the protocol says
    404, which lodger answers by sending the refused request again): the call that met it
    is an error result that says the server went away, the next one opens a new session."""
    import os
    import signal

    from lodger.tools.spec import ToolContext

    port = _free_port()
    first = await _http_everything(port)
    second = None
    try:
        config = McpServerConfig(name="web", url=f"http://127.0.0.1:{port}/mcp")
        async with McpServers([config]) as servers:
            (echo,) = [t for t in servers.tools() if t.name == "web__echo"]
            ctx = ToolContext(
                session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o"
            )
            assert "one" in (await echo.handler({"message": "one"}, ctx)).content
            os.kill(first.pid, signal.SIGKILL)  # its sessions die with the process
            await first.wait()
            second = await _http_everything(port)  # a new process: it knows no session
            with pytest.raises(ToolCallError, match="is not available"):
                await echo.handler({"message": "lost"}, ctx)
            assert "two" in (await echo.handler({"message": "two"}, ctx)).content
            assert servers.reconnects() == {"web": 1}
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.slow
async def test_sigkill_while_a_question_waits_leaves_a_verifiable_log_that_parks(
    tmp_path: Path,
) -> None:
    """The process dies while the call waits for the person: the log holds the question
    and no answer, verifies, and the call (past T1, never_retry) waits for an operator."""
    import asyncio
    import os
    import signal

    from lodger.runtime.sessions import Sessions

    state = tmp_path / "state"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent / "_mcp_asking_child.py"), str(state),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            while True:
                await asyncio.sleep(0.1)
                if not state.exists():
                    continue
                async with Sessions(Storage.local(state)) as sessions:
                    if "s" in await sessions.list_sessions():
                        kinds = [e.kind for e in await sessions.storage.log.read("s")]
                        if "elicitation_requested" in kinds:
                            break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
    async with Sessions(Storage.local(state)) as sessions:
        events = await sessions.storage.log.read("s")
        plan = await sessions.plan("s")
    kinds = [e.kind for e in events]
    assert "elicitation_requested" in kinds and "elicitation_answered" not in kinds
    (call,) = [c for c in plan.calls if c.call_id == "ask"]
    assert (call.status, call.action, call.recovery) == ("indeterminate", "park", "never_retry")


@pytest.mark.slow
@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm ci in tests/mcp_servers")
async def test_a_url_required_error_sends_the_person_and_the_model_calls_again(
    tmp_path: Path,
) -> None:
    shown: list[str | None] = []

    async def person(question: Elicitation) -> ElicitationReply:
        shown.append(question.url)
        return ElicitationReply(action="accept")

    url = "https://auth.example.test/authorize?state=xyz123"
    arguments = {"url": url, "errorPath": True, "elicitationId": "e-7"}
    script = Script(
        [
            ("every__trigger-url-elicitation", arguments),
            ("every__trigger-url-elicitation", arguments),
        ]
    )
    events = await run(tmp_path, [everything()], script, elicitor=person)
    first = script.result("c1")
    assert first.is_error and "call it again" in first.content
    assert not script.result("c2").is_error
    # the error path's prerequisite (a URL of the server's choosing), then the retry's
    prerequisite, asked = shown
    assert prerequisite and prerequisite.startswith("https://") and asked == url
    assert [r.mode for r in bodies(events, ElicitationRequested)] == ["url", "url"]
    model_saw = "".join(repr(r.messages) for r in script.requests)
    assert prerequisite not in model_saw
