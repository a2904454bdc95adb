"""What the subagent tests share: models that route by task, counted effects, and the
agent the crash tests run in a child process (``python subagent_world.py STATE MODE``).

Modes of the child process:
  none           run the parent's turn to its end
  after_child    SIGKILL the process after the child's turn ended, before the parent's
                 delegate T2 (an after-call hook of the delegate call)
  child_midturn  SIGKILL the process while the child waits for its second model step
                 (its first call's T2 is committed)
  grandchild_midturn  as child_midturn, two levels down: parent -> middle -> child
                 (resume with mode "nested")
  before_child   SIGKILL the process after the delegate's T1, when the child's first
                 event is about to be written (the real log's open_writer, wrapped)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lodger import Agent, ScriptedModel, tool
from lodger.engine.hooks import CallInfo, CallResult
from lodger.engine.settings import Hooks
from lodger.providers.base import ModelRequest, ModelResponse, UserMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.subagents import SubagentPolicy
from lodger.tools.spec import Tool

PARENT_TASK = "parent task"
MIDDLE_TASK = "middle task"
CHILD_TASK = "child task"


def task_of(request: ModelRequest) -> str:
    """The turn's input: the last user message that is an input."""
    for message in reversed(request.messages):
        if isinstance(message, UserMessage) and message.source == "input":
            return message.text
    return ""


def routed(scripts: Mapping[str, Any], *, name: str = "routed") -> FunctionModel:
    """One model for parent and children: the turn's input picks the script (a list of
    steps for a ScriptedModel, or a function of the request)."""
    models = {
        task: (script if callable(script) else ScriptedModel(script))
        for task, script in scripts.items()
    }

    async def complete(request: ModelRequest) -> ModelResponse | str:
        task = task_of(request)
        model = models.get(task)
        if model is None:
            raise AssertionError(f"no script for task {task!r}")
        if isinstance(model, ScriptedModel):
            return await model.complete(request)
        result = model(request)
        if asyncio.iscoroutine(result):
            result = await result
        return result  # type: ignore[no-any-return]

    return FunctionModel(complete, name=name)


def effect_tool(effects: Path) -> Tool:
    """Appends a line to ``effects``: a count of effects kept outside the log."""

    @tool
    def effect(n: int) -> str:
        """Record effect n."""
        with effects.open("a") as f:
            f.write(f"{n}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"effect {n} done"

    return effect


def steps_since_input(request: ModelRequest) -> int:
    """How many model outputs this turn has had (what a scripted model counts)."""
    from lodger.providers.base import AssistantMessage

    count = 0
    for message in reversed(request.messages):
        if isinstance(message, UserMessage) and message.source == "input":
            break
        if isinstance(message, AssistantMessage):
            count += 1
    return count


def crash_agent(state: Path, workspace: Path, effects: Path, mode: str) -> Agent:
    def child(request: ModelRequest) -> ModelResponse | str:
        step = steps_since_input(request)
        if step == 0:
            from lodger.providers.scripted import tool_call

            return ModelResponse(calls=(tool_call("effect", n=1),))
        if mode in ("child_midturn", "grandchild_midturn"):
            os.kill(os.getpid(), signal.SIGKILL)
        return "child answer: effect 1 is done"

    to_child = {"name": "delegate", "args": {"task": CHILD_TASK, "tools": ["effect"]}}
    if mode == "grandchild_midturn" or mode == "nested":
        # parent -> middle -> child: the child is a grandchild of the parent
        to_middle = {
            "name": "delegate",
            "args": {"task": MIDDLE_TASK, "tools": ["effect", "delegate"]},
        }
        parent = [{"calls": [to_middle]}, {"text": "parent done"}]
    else:
        parent = [{"calls": [to_child]}, {"text": "parent done"}]
    middle = [{"calls": [to_child]}, {"text": "middle done"}]

    def kill_after_delegate(info: CallInfo, result: CallResult) -> None:
        if mode == "after_child" and info.tool == "delegate":
            os.kill(os.getpid(), signal.SIGKILL)

    return Agent(
        model=routed({PARENT_TASK: parent, MIDDLE_TASK: middle, CHILD_TASK: child}),
        tools=[effect_tool(effects)],
        storage=state,
        workspace=workspace,
        subagents=SubagentPolicy(max_depth=2),
        hooks=Hooks(after_call=[kill_after_delegate]),
    )


async def _main(state: Path, mode: str) -> None:
    root = state.parent
    async with crash_agent(state, root / "ws", root / "effects.txt", mode) as agent:
        if mode == "before_child":
            log = agent.log
            real = log.open_writer

            async def open_writer(session_id: str, **kwargs: Any) -> Any:
                if session_id.startswith("sub-"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return await real(session_id, **kwargs)

            log.open_writer = open_writer  # type: ignore[method-assign]
        await agent.run(PARENT_TASK, session="parent-1")


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))
