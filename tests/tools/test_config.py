"""MCP servers from lodger.toml and --mcp; catalogs from JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.errors import ConfigError
from lodger.runtime.config import load_catalog, load_mcp_servers, parse_mcp_option

TOML = """
[mcp.servers.git]
command = "mcp-server-git"
args = ["--repository", "."]
env = { TOKEN = "${LODGER_TEST_TOKEN}", PLAIN = "x" }
approval = ["git_commit", "git_reset*"]
timeout_s = 30

[mcp.servers.docs]
url = "http://127.0.0.1:8000/mcp"
headers = { Authorization = "Bearer ${LODGER_TEST_TOKEN}" }
deferred = false
approval = true
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "lodger.toml").write_text(text)
    return tmp_path


def test_lodger_toml_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LODGER_TEST_TOKEN", "s3cret")
    git, docs = load_mcp_servers(write(tmp_path, TOML))
    assert (git.name, git.transport, git.command, git.args) == (
        "git", "stdio", "mcp-server-git", ("--repository", ".")
    )  # fmt: skip
    assert git.env == {"TOKEN": "s3cret", "PLAIN": "x"}
    assert git.cwd == str(tmp_path.resolve())  # stdio servers start in the workspace
    assert git.timeout_s == 30.0 and git.deferred
    assert git.asks("git_commit") and git.asks("git_reset_hard") and not git.asks("git_log")
    assert (docs.transport, docs.deferred, docs.asks("anything")) == ("http", False, True)
    assert docs.headers == {"Authorization": "Bearer s3cret"}


def test_mcp_options_add_servers_and_replace_file_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LODGER_TEST_TOKEN", "t")
    servers = load_mcp_servers(
        write(tmp_path, TOML),
        ["git=uvx 'mcp-server-git' --repository 'my repo'", "web=https://example.test/mcp"],
    )
    by_name = {s.name: s for s in servers}
    assert list(by_name) == ["git", "docs", "web"]
    assert (by_name["git"].command, by_name["git"].args) == (
        "uvx", ("mcp-server-git", "--repository", "my repo")
    )  # fmt: skip
    assert by_name["git"].approval is False  # a --mcp server has the defaults
    assert by_name["web"].url == "https://example.test/mcp"
    assert load_mcp_servers(tmp_path / "nothing-here") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[mcp.servers.a]\ncommand = "x"\ncomand = "y"\n', "unknown key 'comand'"),
        ('[mcp.servers.a]\ncommand = "x"\ntimeout_s = true\n', "timeout_s has the wrong type"),
        ('[mcp.servers.a]\ncommand = "x"\nargs = [1]\n', "must be a list of strings"),
        ('[mcp.servers.a]\ncommand = "x"\nenv = { K = "${LODGER_UNSET_X}" }\n', "not set"),
        ('[mcp.servers.a]\nurl = "http://h"\ncommand = "x"\n', "exactly one of"),
        ("[mcp.servers.a__b]\ncommand = 'x'\n", "is not usable"),
        ("[mcp.servers\n", "not valid TOML"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_mcp_servers(write(tmp_path, text))


@pytest.mark.parametrize("spec", ["noequals", "=cmd", "name=", "x=unclosed 'quote"])
def test_bad_mcp_options(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_mcp_option(spec)


def test_catalogs(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(
        '[{"name": "query", "description": "Run SQL", "inputSchema": {"type": "object"},'
        ' "group": "pg"}, {"name": "plain", "description": "No group"}]'
    )
    query, plain = load_catalog(path)
    assert (query.name, query.group, query.deferred) == ("pg__query", "pg", True)
    assert (plain.name, plain.group) == ("plain", "catalog")
    path.write_text('{"name": "x"}')
    with pytest.raises(ConfigError, match="must be a JSON list"):
        load_catalog(path)
    path.write_text('[{"description": "no name"}]')
    with pytest.raises(ConfigError, match="entry 0"):
        load_catalog(path)
