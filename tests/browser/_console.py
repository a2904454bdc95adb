"""What the console's browser tests share: a real ``lodger serve`` subprocess (over a
``--state`` directory or a ``--store`` URL), Debian's Chromium driven by Playwright, axe-core
from ``tests/browser/node_modules`` and a place for screenshots."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright

from lodger.client import HostClient

HERE = Path(__file__).parent
TOOLS = HERE.parent / "host" / "host_tools.py"
SRC = HERE.parents[1] / "src"
AXE = HERE / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "lgr_console-test-admin-token-0123456789abcdef0"


def script(path: Path, steps: Sequence[Any]) -> str:
    path.write_text(json.dumps(steps))
    return f"script:{path}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lodger_env(gates: Path) -> dict[str, str]:
    env = {**os.environ, "LODGER_HOST_TOKEN": TOKEN, "HOST_TEST_GATES": str(gates)}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]

    def client(self) -> HostClient:
        return HostClient(self.url, token=TOKEN)

    def console(self, fragment: str = "/sessions") -> str:
        return f"{self.url}/console#token={TOKEN}&{fragment.lstrip('#')}"


@asynccontextmanager
async def serve(storage: list[str], model: str, gates: Path, out: Path) -> AsyncIterator[Served]:
    """``lodger serve`` with the host tests' tools, on a free loopback port."""
    port = _free_port()
    argv = [sys.executable, "-m", "lodger", "serve", *storage, "--port", str(port)]
    argv += ["--model", model, "--tools", str(TOOLS), "--poll", "0.2"]
    with out.open("w") as sink:
        proc = await asyncio.to_thread(
            subprocess.Popen,
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=lodger_env(gates),
            cwd=out.parent,
        )
    try:
        async with asyncio.timeout(30):
            while "lodger host on" not in await asyncio.to_thread(out.read_text):
                if proc.poll() is not None:
                    said = await asyncio.to_thread(out.read_text)
                    raise AssertionError(f"host exited {proc.returncode}: {said}")
                await asyncio.sleep(0.05)
        yield Served(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


@asynccontextmanager
async def chromium(dark: bool = False) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def new_page(browser: Browser, *, dark: bool = False) -> Page:
    context = await browser.new_context(
        color_scheme="dark" if dark else "light", viewport={"width": 1400, "height": 900}
    )
    page = await context.new_page()
    page.set_default_timeout(20_000)
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on(
        "console",
        lambda msg: problems.append(f"{msg.text} {msg.location}") if msg.type == "error" else None,
    )
    page.problems = problems  # type: ignore[attr-defined]
    return page


def artifacts_dir(tmp_path: Path) -> Path:
    named = os.environ.get("LODGER_TEST_ARTIFACTS")
    where = Path(named) if named else tmp_path / "artifacts"
    where.mkdir(parents=True, exist_ok=True)
    return where


async def shot(page: Page, where: Path, name: str) -> Path:
    path = where / f"console-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5_000  # a page with content, not a blank one
    return path


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations of the page as it is now. The checker is
    evaluated through the DevTools protocol: the page's CSP (no inline script) holds."""
    await page.evaluate(AXE.read_text(encoding="utf-8"))
    result: dict[str, Any] = await page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})"
    )
    return [v for v in result["violations"] if v.get("impact") in ("serious", "critical")]


async def wait_for(predicate: Any, *, within: float = 20.0) -> Any:
    async with asyncio.timeout(within):
        while True:
            found = await predicate()
            if found:
                return found
            await asyncio.sleep(0.05)
