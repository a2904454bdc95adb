"""A worker that parks approvals (as ``lodger worker --approval-park``) and SIGKILLs
itself right after the control plane recorded its first question: before it indexes the
session, finishes the wake or releases the session's lease.

    python _park_killer.py STORE DSN SCRIPT TOOLS WORKDIR
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lodger.cli._toolsfile import load_tools_file
from lodger.providers import make_model
from lodger.runtime.approvals import ParkingApprovals
from lodger.runtime.sessions import Binding
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control import open_control
from lodger.storage.control.interface import ControlPlane


class KilledAfterPark:
    """The real control plane; the process dies as soon as a question is recorded."""

    def __init__(self, inner: ControlPlane) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def park_approval(self, **kwargs: Any) -> Any:
        asked = await self._inner.park_approval(**kwargs)
        # the pid for the test, written synchronously: nothing else may run before the kill
        Path(os.environ["LODGER_TEST_DIR"], "parked-by").write_text(str(os.getpid()))  # noqa: ASYNC240
        os.kill(os.getpid(), signal.SIGKILL)
        return asked


async def main(store: str, dsn: str, script: str, tools: str, workdir: str) -> None:
    plane = open_control(dsn)
    await plane.start()
    approvals = ParkingApprovals(plane)

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        return Binding(
            model=make_model(f"script:{script}"),
            tools=load_tools_file(tools),
            workspace=workspace,
            approver=approvals.approver(session_id),
        )

    worker = Worker(
        control=KilledAfterPark(plane),  # type: ignore[arg-type]
        storage=Storage.from_url(store),
        bind=bind,
        config=WorkerConfig(lease_ttl_s=2.0, poll_s=0.05),
        workdir=Path(workdir),
    )
    await worker.run(asyncio.Event())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
