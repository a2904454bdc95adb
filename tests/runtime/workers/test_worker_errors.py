"""A turn that fails with an exception lodger does not know (a bug in a model adapter or a
tool binding) fails that wake only: the worker logs it, retries the wake, drops it after
``max_attempts`` and keeps serving the other sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger import FunctionModel
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.runtime.sessions import Binding
from lodger.runtime.worker import Worker, WorkerConfig
from lodger.storage import Storage
from lodger.storage.control import open_control


class AdapterBug(RuntimeError):
    pass


async def _serve(
    tmp_path: Path, attempts: int, fail_sessions: set[str]
) -> tuple[Worker, dict[str, str]]:
    control = open_control(str(tmp_path / "control.sqlite3"))
    await control.start()
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    calls: list[str] = []
    wakes: dict[str, tuple[str, str | None]] = {}

    def bind(session_id: str, recorded: str | None, workspace: Path) -> Binding:
        def answer(request: ModelRequest) -> ModelResponse:
            calls.append(session_id)
            if session_id in fail_sessions:
                raise AdapterBug("the adapter broke")
            return ModelResponse(text=f"done {session_id}")

        return Binding(model=FunctionModel(answer), workspace=workspace)

    config = WorkerConfig(poll_s=0.02, retry_delay_s=0.0, max_attempts=attempts, lease_ttl_s=5)
    worker = Worker(control=control, storage=storage, bind=bind, config=config,
                    workdir=tmp_path)  # fmt: skip
    stop = asyncio.Event()
    try:
        for sid in ("broken", "fine"):
            await control.send(session_id=sid, message=f"hello {sid}", idempotency_key=sid)
        running = asyncio.ensure_future(worker.run(stop))
        statuses: dict[str, str] = {}
        for _ in range(500):
            if running.done():
                break  # the worker stopped: the test fails below with its exception
            rows = {row.session_id: row.status for row in await control.list_sessions()}
            if not await control.pending_wakes() and len(rows) == 2:
                statuses = rows
                break
            await asyncio.sleep(0.02)
        assert not running.done(), running.exception()
        stop.set()
        await asyncio.wait_for(running, 10)
        for sid in ("broken", "fine"):
            info = await control.wake_for_key(idempotency_key=sid)
            assert info is not None
            wakes[sid] = (info.status, info.error)
    finally:
        await storage.close()
        await control.close()
    assert calls.count("broken") == attempts
    # the given-up wake reads failed, with why; the other one done
    assert wakes == {
        "broken": ("failed", "internal_error: AdapterBug: the adapter broke"),
        "fine": ("done", None),
    }
    return worker, statuses


def test_an_unexpected_exception_fails_the_wake_not_the_worker(tmp_path: Path) -> None:
    worker, statuses = asyncio.run(_serve(tmp_path, attempts=2, fail_sessions={"broken"}))
    assert statuses == {"broken": "error:internal_error", "fine": "completed"}
    assert worker.stats.failed == 2
    assert worker.stats.turns == 1
