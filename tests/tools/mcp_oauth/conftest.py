"""A protected MCP server with its own OAuth authorization server, started per module.

``tests/mcp_servers/oauth_server.py`` runs as a subprocess on a free loopback port; each
test starts it well-behaved (``/_test/mode`` is reset) and in a config directory of its
own, so logins never touch the user's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.tools.mcp_oauth.guarded import SERVER, Guarded

_WELL_BEHAVED = {
    "metadata": None,
    "token": None,
    "register": None,
    "authorize": None,
    "access_ttl": 3600,
}


@pytest.fixture(scope="module")
def _server() -> Iterator[Guarded]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("PORT "), line
        yield Guarded(base=f"http://127.0.0.1:{int(line.split()[1])}")
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def guarded(_server: Guarded) -> Guarded:
    _server.mode(**_WELL_BEHAVED)
    return _server


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config directory for this test (logins go under it), keyring off."""
    directory = tmp_path / "config"
    monkeypatch.setenv("LODGER_CONFIG_DIR", str(directory))
    monkeypatch.setenv("LODGER_MCP_STORE", "file")
    return directory
