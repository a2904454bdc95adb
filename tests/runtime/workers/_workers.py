"""Real ``lodger worker`` processes for the tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lodger.storage import Storage

TOOLS = Path(__file__).with_name("_worker_tools.py")
SRC = Path(__file__).resolve().parents[3] / "src"
LODGER = [
    sys.executable,
    "-c",
    "import sys; from lodger.cli import main; sys.argv[0] = 'lodger'; main()",
]


def env(test_dir: Path) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = f"{SRC}{os.pathsep}{out.get('PYTHONPATH', '')}"
    out["LODGER_TEST_DIR"] = str(test_dir)
    out.pop("LODGER_STORE", None)
    return out


def lodger(test_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LODGER, *args], env=env(test_dir), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


class Workers:
    """Worker processes on one store and control plane; all are SIGKILLed at the end."""

    def __init__(self, test_dir: Path, store: str, control: str, script: Path) -> None:
        self.dir, self.store, self.control, self.script = test_dir, store, control, script
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, *extra: str, lease_ttl: float = 2.0, model: bool = True, capture: bool = False
    ) -> subprocess.Popen[str]:
        """A worker process. Its output goes to ``worker-N.log`` in the test directory
        (kept for a failed test to be read; a pipe nobody drains would stop a worker that
        logs a lot), or to pipes the caller reads with ``communicate`` (``capture``)."""
        spec = ["--model", f"script:{self.script}"] if model else []
        argv = [*LODGER, "worker", "--store", self.store, "--control", self.control,
                *spec, "--tools", str(TOOLS), "--poll", "0.05",
                "--lease-ttl", str(lease_ttl), "--grace", "5", "--workdir", str(self.dir),
                *extra]  # fmt: skip
        if capture:
            proc = subprocess.Popen(argv, env=env(self.dir), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
        else:
            with (self.dir / f"worker-{len(self.procs)}.log").open("w") as log:
                proc = subprocess.Popen(argv, env=env(self.dir), stdout=log,
                                        stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def log(self, index: int) -> str:
        """What worker ``index`` (in start order, not captured) wrote so far."""
        return (self.dir / f"worker-{index}.log").read_text(errors="replace")

    def send(self, *args: str) -> subprocess.CompletedProcess[str]:
        return lodger(self.dir, "send", *args, "--control", self.control, "--json")

    def has_session(self, session: str) -> bool:
        async def exists() -> bool:
            storage = Storage.from_url(self.store)
            try:
                return await storage.log.exists(session)
            finally:
                await storage.close()

        return asyncio.run(exists())

    def events(self, session: str) -> list[dict[str, Any]]:
        """The session's verified events, as JSON values."""

        async def read() -> list[dict[str, Any]]:
            storage = Storage.from_url(self.store)
            try:
                return [e.model_dump(mode="json") for e in await storage.log.read_all(session)]
            finally:
                await storage.close()

        return asyncio.run(read())

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``check`` until it holds (event-ordered: the bound is only a hang guard)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
