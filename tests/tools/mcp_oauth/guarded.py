"""The protected MCP server of these tests, and a test client in place of a browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SERVER = Path(__file__).parents[2] / "mcp_servers" / "oauth_server.py"
SRC = Path(__file__).parents[3] / "src"


@dataclass(frozen=True)
class Guarded:
    """The running server: its MCP URL and its test controls."""

    base: str

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def mode(self, **changes: Any) -> None:
        self._post("/_test/mode", changes)

    def expire(self, *, refresh: bool = False) -> None:
        self._post("/_test/expire", {"refresh": refresh})

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/_test/state", timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result


def approve(authorization_url: str) -> str:
    """Follow the authorization URL as a browser would, up to the redirect it answers
    with; that redirect's URL (the callback, not yet visited)."""
    request = urllib.request.Request(authorization_url, method="GET")
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        opener.open(request, timeout=10)
    except urllib.error.HTTPError as answer:
        with answer:  # its connection, closed
            if answer.code in (302, 303, 307):
                return str(answer.headers["Location"])
            raise
    raise AssertionError("the authorization endpoint did not redirect")


def callback_query(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def cli_env(config_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "LODGER_CONFIG_DIR": str(config_dir),
        "LODGER_MCP_STORE": "file",
    }


def login(
    ws: Path, config_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``lodger mcp login guarded``, with a test client in place of the browser: it reads
    the authorization URL the command prints, follows it, and visits the callback."""
    command = [sys.executable, "-m", "lodger", "mcp", "login", "guarded", "--trust",
               "--no-browser", "--json", "-w", str(ws), "--timeout", "60", *extra]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or cli_env(config_dir),
    )
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        callback = approve(first["authorization_url"])
        assert callback.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(callback, timeout=10) as page:
            assert b"reached lodger" in page.read()
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def every_byte(*roots: Path) -> bytes:
    found = bytearray()
    for root in roots:
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.is_file():
                found += path.read_bytes()
    return bytes(found)
