"""The library door of the parity test: a program that composes its project with
``lodger.runtime`` and runs it with ``Sessions``, as the README shows. The test calls
``drive`` in its own process, or runs this file as a child it can SIGKILL::

    python _library_door.py run|resume SESSION TASK WORKSPACE MODEL (--state DIR | --store URL)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

from lodger.runtime import Overrides, Project, StorageLocation, compose
from lodger.runtime.agent import TurnResult
from lodger.runtime.sessions import Sessions
from lodger.tools.spec import Tool

TOOLS_FILE = Path(__file__).with_name("_parity_tools.py")


def _tools() -> list[Tool]:
    spec = importlib.util.spec_from_file_location("parity_tools", TOOLS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [value for value in vars(module).values() if isinstance(value, Tool)]


async def approve(tool: Tool, arguments: dict[str, Any]) -> str:
    """The program's approver: it allows the call once (the others' person says yes)."""
    return "once"


async def drive(
    command: str, *, session: str, task: str, workspace: Path, model: str, where: StorageLocation
) -> TurnResult:
    binding = compose(
        # a program trusts the project it was written for
        Project.load(workspace, trusted=True),
        Overrides(model=model, tools=_tools(), approver=approve),
    )
    try:
        async with Sessions(where.open()) as sessions:
            if command == "resume":
                return await sessions.resume(session, binding=binding)
            return await sessions.run(task, binding=binding, session=session)
    finally:
        await binding.model.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "resume"])
    parser.add_argument("session")
    parser.add_argument("task")
    parser.add_argument("workspace", type=Path)
    parser.add_argument("model")
    parser.add_argument("--state", default=".lodger")
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    where = StorageLocation(state=args.state, store=args.store)
    result = asyncio.run(
        drive(args.command, session=args.session, task=args.task, workspace=args.workspace,
              model=args.model, where=where)
    )  # fmt: skip
    print(f"turn {result.status}", flush=True)
    sys.exit(0 if result.status == "completed" else 1)


if __name__ == "__main__":
    main()
