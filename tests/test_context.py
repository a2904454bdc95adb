"""The context projection: pure, incremental = full, call order, hidden and dangling out."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.context import MessageSnapshot, Projector, estimate_tokens, project_messages
from lodger.engine.settings import Limits, Services
from lodger.events import (
    ContextCompacted,
    Event,
    ModelOutput,
    ProposedCall,
    ToolDispatched,
    ToolResponded,
    TurnStarted,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import AssistantMessage, ToolResultMessage, UserMessage
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, MemoryLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools import tool


@tool
async def fetch(n: int) -> str:
    """A result of n kilobytes."""
    await asyncio.sleep(0.001 * (3 - n % 3))  # completion order differs from emission order
    return "x" * (1000 * n)


SCRIPT = [
    {"calls": [{"name": "fetch", "args": {"n": 1}}, {"name": "fetch", "args": {"n": 2}}]},
    {"text": "more", "calls": [{"name": "fetch", "args": {"n": 3}}, {"name": "nope"}]},
    {"calls": [{"name": "fetch", "args": {"n": 4}}]},
    {"text": "done"},
    {"text": "second turn"},
]


def _session(budget: int | None = None) -> list[Event]:
    async def build() -> list[Event]:
        agent = Agent(
            model=ScriptedModel(SCRIPT),
            tools=[fetch],
            storage=Storage(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore()),
            services=Services(clock=ManualClock(tick_us=3), ids=SequentialIds("c")),
            limits=Limits(context_budget=budget),
        )
        await agent.run("one", session="s")
        await agent.run("two", session="s")
        return await agent.session("s").events()

    return asyncio.run(build())


EVENTS = _session()


@settings(max_examples=len(EVENTS) + 1)
@given(st.integers(min_value=0, max_value=len(EVENTS)), st.sampled_from([None, 50, 600, 5000]))
def test_incremental_projection_equals_the_full_one(n: int, budget: int | None) -> None:
    projector = Projector(EVENTS[:0])
    growing: list[Event] = []
    projector = Projector(growing)
    for event in EVENTS[:n]:  # fold one event at a time, projecting as a run would
        growing.append(event)
        projector.project(budget_tokens=budget)
    assert projector.project(budget_tokens=budget) == project_messages(
        EVENTS[:n], budget_tokens=budget
    )


@settings(max_examples=60)
@given(
    st.integers(min_value=0, max_value=len(EVENTS)),
    st.integers(min_value=0, max_value=len(EVENTS)),
    st.sampled_from([None, 50, 5000]),
)
def test_a_projection_over_an_inherited_prefix_equals_the_whole_lineage(
    cut: int, n: int, budget: int | None
) -> None:
    # a fork's context: the parent's events before ``cut`` are the inherited prefix,
    # the rest are folded one by one as the fork's own
    prefix, own = EVENTS[:cut], EVENTS[cut : max(cut, n)]
    growing: list[Event] = []
    projector = Projector(growing, prefix=prefix)
    for event in own:
        growing.append(event)
        projector.project(budget_tokens=budget)
    assert projector.project(budget_tokens=budget) == project_messages(
        [*prefix, *own], budget_tokens=budget
    )


def test_results_follow_their_output_in_emission_order() -> None:
    messages = project_messages(EVENTS).messages
    first_output = next(i for i, m in enumerate(messages) if isinstance(m, AssistantMessage))
    results = messages[first_output + 1 : first_output + 3]
    assert [r.call_id for r in results] == ["call-0-1", "call-0-2"]  # type: ignore[union-attr]
    responded = [e.call_id for e in EVENTS if isinstance(e.body, ToolResponded)][:2]
    assert responded == ["call-0-2", "call-0-1"]  # the log holds completion order
    assert [m.text for m in messages if isinstance(m, UserMessage)] == ["one", "two"]


def test_hidden_and_dangling_calls_never_reach_the_model() -> None:
    def draft(body: object, **env: object) -> Event:
        return Event(offset=0, session_id="s", id="i", ts=0, body=body, **env)  # type: ignore[arg-type]

    events = [
        draft(TurnStarted(input="go"), turn_id="t"),
        draft(
            ModelOutput(
                calls=(
                    ProposedCall(call_id="a", name="exec", arguments="{}"),
                    ProposedCall(call_id="b", name="fetch", arguments="{}"),
                )
            ),
            turn_id="t",
        ),
        draft(ToolDispatched(operation_id="o1", tool="exec", arguments={}), call_id="a"),
        draft(
            ToolDispatched(operation_id="o2", tool="fetch", arguments={}),
            call_id="n1",
            parent_call_id="a",
            visibility="hidden",
        ),
        draft(
            ToolResponded(operation_id="o2", status="ok", content="secret"),
            call_id="n1",
            parent_call_id="a",
            visibility="hidden",
        ),
        draft(ToolResponded(operation_id="o1", status="ok", content="cell result"), call_id="a"),
        draft(ToolDispatched(operation_id="o3", tool="fetch", arguments={}), call_id="b"),
    ]
    messages = project_messages(events).messages
    assistant = messages[1]
    assert isinstance(assistant, AssistantMessage)
    assert [c.call_id for c in assistant.calls] == ["a"]  # b is dangling: stripped
    assert [m.content for m in messages if isinstance(m, ToolResultMessage)] == ["cell result"]


def test_budget_elides_oldest_results_and_records_a_fact() -> None:
    # up to the result of the step-2 call: that output is the latest one
    cut = next(
        i for i, e in enumerate(EVENTS) if e.call_id == "call-2-1" and e.kind == "tool_responded"
    )
    prefix = EVENTS[: cut + 1]
    full = project_messages(prefix)
    tight = project_messages(prefix, budget_tokens=full.estimated_tokens // 3)
    assert tight.elided_call_ids[0] == "call-0-1"  # oldest first
    assert "call-2-1" not in tight.elided_call_ids  # the latest output's results stay
    assert tight.estimated_tokens < full.estimated_tokens
    assert tight.estimated_tokens == estimate_tokens(tight.messages)
    compacted = [e.body for e in _session(budget=800) if isinstance(e.body, ContextCompacted)]
    assert compacted
    assert compacted[0].budget_tokens == 800


@settings(max_examples=len(EVENTS) + 1)
@given(st.integers(min_value=0, max_value=len(EVENTS)))
def test_the_scripted_models_counter_equals_a_full_count(n: int) -> None:
    from lodger.providers.base import ModelRequest
    from lodger.providers.scripted import _OutputCounter, outputs_so_far

    counter = _OutputCounter()
    growing: list[Event] = []
    projector = Projector(growing)
    for event in EVENTS[:n]:
        growing.append(event)
        request = ModelRequest(system="", messages=projector.project().messages)
        assert counter.count(request) == outputs_so_far(request)
    # a request that is not a continuation (another session) is counted anew
    fresh = ModelRequest(system="", messages=project_messages(EVENTS[: n // 2]).messages)
    assert counter.count(fresh) == outputs_so_far(fresh)


def test_a_projection_view_reads_and_concatenates_like_the_tuple_it_replaced() -> None:
    base = [UserMessage(text=f"m{i}") for i in range(5)]
    view = MessageSnapshot(base, 3, (UserMessage(text="tail"),))
    base.append(UserMessage(text="later"))  # appended after the view was taken
    assert list(view) == [*base[:3], UserMessage(text="tail")]
    assert view == tuple(view) and view[-1] == UserMessage(text="tail")
    extra = (UserMessage(text="x"),)
    assert view + extra == (*base[:3], UserMessage(text="tail"), *extra)
    assert extra + view == (*extra, *base[:3], UserMessage(text="tail"))
    assert isinstance(view + extra, tuple)


def test_every_intermediate_projection_equals_the_full_one() -> None:
    """Projected after every event (a result arriving after the open output was
    projected, outputs closing what was projected before): each step's projection, not
    only the last, equals the full one, and so does the model request's message list."""
    for budget in (None, 50, 600):
        growing: list[Event] = []
        projector = Projector(growing)
        for event in EVENTS:
            growing.append(event)
            got = projector.project(budget_tokens=budget)
            want = project_messages(growing, budget_tokens=budget)
            assert got == want
            assert list(got.messages) == list(want.messages)
            assert got.estimated_tokens == want.estimated_tokens
