"""Delegations of one tree on different workers reserve one at a time: the control
plane's named lease ``subagent-tree:<root>`` (a real SQLite control plane file, two
launchers with different holders, as two workers have)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.runtime.subagents import detached
from lodger.runtime.subagents.detached import ControlPlaneChildren
from lodger.storage import Storage
from lodger.storage.control import ControlPlane, open_control
from lodger.storage.control.fencing import LeaseGuard


class _Refusals:
    """The real control plane, counting the named leases it refused (fault-injection
    style: a wrapper, nothing patched)."""

    def __init__(self, inner: ControlPlane) -> None:
        self.inner = inner
        self.refused = 0
        self.refused_once = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_named(self, **kwargs: Any) -> Any:
        lease = await self.inner.acquire_named(**kwargs)
        if lease is None:
            self.refused += 1
            self.refused_once.set()
        return lease


def _launcher(control: Any, storage: Storage, holder: str) -> ControlPlaneChildren:
    return ControlPlaneChildren(
        control, storage.artifacts, guard=LeaseGuard(control), holder=holder, ttl_s=30.0
    )


async def test_a_second_worker_reserves_only_after_the_first_is_done(tmp_path: Path) -> None:
    control = open_control(str(tmp_path / "control.sqlite3"))
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    watched = _Refusals(control)
    first, second = _launcher(control, storage, "w1"), _launcher(watched, storage, "w2")
    order: list[str] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def hold_first() -> None:
        async with first.reserving("root-1"):
            order.append("first in")
            entered.set()
            await release.wait()
            order.append("first out")

    async def then_second() -> None:
        await entered.wait()
        async with second.reserving("root-1"):
            order.append("second in")

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(hold_first())
            tg.create_task(then_second())
            await watched.refused_once.wait()  # the second tried while the first held it
            async with second.reserving("root-2"):  # another tree is not held up
                order.append("other tree")
            release.set()
    finally:
        await storage.close()
        await control.close()
    assert order == ["first in", "other tree", "first out", "second in"]


async def test_a_worker_that_cannot_reserve_in_time_gets_a_tool_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detached, "_RESERVE_WAIT", 0.2)
    control = open_control(str(tmp_path / "control.sqlite3"))
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    first, second = _launcher(control, storage, "w1"), _launcher(control, storage, "w2")
    try:
        async with first.reserving("root-1"):
            with pytest.raises(ToolCallError) as refused:
                async with second.reserving("root-1"):
                    raise AssertionError("entered a held tree")
        assert refused.value.code == "subagent_busy"
        async with second.reserving("root-1"):  # released: free again
            pass
    finally:
        await storage.close()
        await control.close()
