"""``lodger tools list|search`` and ``lodger run --mcp``, with a catalog, lodger.toml and
a real MCP server."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lodger.cli import main

DATA = Path(__file__).parent.parent / "data"
CATALOG = str(DATA / "mcp_catalog.json")
TINY = Path(__file__).parent.parent / "mcp_servers" / "tiny_server.py"
TINY_SPEC = f"tiny={shlex.quote(sys.executable)} {shlex.quote(str(TINY))}"


def lodger(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_a_catalog_as_json() -> None:
    result = lodger("tools", "list", "--catalog", CATALOG, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    catalog = json.loads(Path(CATALOG).read_text())
    by_name = {row["name"]: row for row in data["tools"]}
    assert by_name["read_file"]["tier"] == "direct"  # the built-in workspace tools
    assert by_name["tool_search"]["tier"] == "direct"
    github = by_name["github__create_issue"]
    assert (github["tier"], github["group"]) == ("deferred", "github")
    assert github["schema_bytes"] > 100
    summary = data["summary"]
    assert summary["deferred"]["count"] == len(catalog)
    assert summary["direct"]["count"] == 8
    assert 0 < summary["deferred"]["inventory_bytes"] < summary["deferred"]["schema_bytes"] / 5


def test_list_prints_a_table_and_a_summary() -> None:
    result = lodger("tools", "list", "--catalog", CATALOG)
    assert result.exit_code == 0
    assert "time__convert_time" in result.output and "deferred" in result.output
    assert "8 direct" in result.output and "217 deferred" in result.output


@pytest.mark.slow
def test_search_ranks_with_scores_and_marks_what_would_load() -> None:
    result = lodger(
        "tools", "search", "take a screenshot of the page", "--catalog", CATALOG,
        "--limit", "8", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = data["results"]
    assert len(rows) == 8 and [r["rank"] for r in rows] == list(range(1, 9))
    assert {rows[0]["name"], rows[1]["name"]} == {
        "playwright__browser_take_screenshot",
        "puppeteer__puppeteer_screenshot",
    }
    scores = [r["score"] for r in rows]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    assert [r["activates"] for r in rows] == [True] * 5 + [False] * 3
    assert data["terms"] == ["take", "screenshot", "page"]  # Snowball English stems

    text = lodger("tools", "search", "take a screenshot", "--catalog", CATALOG, "--limit", "2")
    assert "playwright__browser_take_screenshot" in text.output and "loads" in text.output


@pytest.mark.slow
def test_search_select_and_no_match() -> None:
    result = lodger("tools", "search", "select:time__convert_time", "--catalog", CATALOG, "--json")
    rows = json.loads(result.output)["results"]
    assert [(r["name"], r["score"], r["activates"]) for r in rows] == [
        ("time__convert_time", None, True)
    ]
    none = lodger("tools", "search", "zzzz qqqq", "--catalog", CATALOG)
    assert none.exit_code == 0 and "no deferred tool matches" in none.output


def test_search_without_deferred_tools_is_a_usage_error(tmp_path: Path) -> None:
    result = lodger("tools", "search", "anything", "--workspace", str(tmp_path))
    assert result.exit_code == 2
    assert "nothing to search" in result.output and "hint: pass --mcp or --catalog" in result.output


@pytest.mark.slow
def test_real_servers_from_mcp_option_and_lodger_toml(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(
        "[mcp.servers.filed]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(TINY))}]\n"
        "deferred = false\n"
    )
    untrusted = lodger("tools", "list", "--workspace", str(tmp_path), "--json")
    assert untrusted.exit_code == 0, untrusted.output
    # a file nobody trusted starts no server: its tools are not there
    assert not any(r["name"].startswith("filed__") for r in json.loads(untrusted.stdout)["tools"])
    assert lodger("trust", str(tmp_path)).exit_code == 0
    result = lodger("tools", "list", "--workspace", str(tmp_path), "--mcp", TINY_SPEC, "--json")
    assert result.exit_code == 0, result.output
    tiers = {r["name"]: r["tier"] for r in json.loads(result.output)["tools"]}
    assert tiers["filed__add"] == "direct" and tiers["tiny__add"] == "deferred"
    found = lodger("tools", "search", "sum of two integers", "--mcp", TINY_SPEC, "--json")
    assert json.loads(found.output)["results"][0]["name"] == "tiny__add"


def test_list_shows_whether_commands_may_write_git(tmp_path: Path) -> None:
    default = lodger("tools", "list", "--workspace", str(tmp_path), "--json")
    assert default.exit_code == 0, default.output
    sandbox = json.loads(default.output)["sandbox"]
    assert sandbox["git_writable"] is False and sandbox["backend"] == "bubblewrap"
    assert ".git read-only" in lodger("tools", "list", "--workspace", str(tmp_path)).output
    (tmp_path / "lodger.toml").write_text("[sandbox]\ngit_writable = true\n")
    untrusted = lodger("tools", "list", "--workspace", str(tmp_path), "--json")
    assert json.loads(untrusted.stdout)["sandbox"]["git_writable"] is False  # not trusted
    assert lodger("trust", str(tmp_path)).exit_code == 0
    opted = lodger("tools", "list", "--workspace", str(tmp_path), "--json")
    assert json.loads(opted.output)["sandbox"]["git_writable"] is True
    text = lodger("tools", "list", "--workspace", str(tmp_path)).output
    assert ".git writable" in text and ".git read-only" not in text


def test_a_bad_mcp_option_or_config_is_one_clear_line(tmp_path: Path) -> None:
    bad = lodger("tools", "list", "--mcp", "no-equals-sign")
    assert bad.exit_code == 2 and "is not NAME=COMMAND or NAME=URL" in bad.output
    (tmp_path / "lodger.toml").write_text('[mcp.servers.x]\ncomand = "typo"\n')
    typo = lodger("tools", "list", "--workspace", str(tmp_path))
    assert typo.exit_code == 2 and "unknown key 'comand'" in typo.output
    assert "Traceback" not in typo.output


@pytest.mark.slow
def test_run_binds_mcp_servers(tmp_path: Path) -> None:
    script = [
        {"calls": [{"name": "tool_search", "args": {"query": "add two integers"}}]},
        {"calls": [{"name": "tiny__add", "args": {"a": 20, "b": 22}}]},
        {"text": "the sum is 42"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    result = lodger(
        "run", "add 20 and 22", "--model", f"script:{tmp_path / 'script.json'}",
        "--workspace", str(tmp_path), "--state", str(tmp_path / "state"), "--mcp", TINY_SPEC,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "-> tiny__add" in result.output and "<- tiny__add ok 42" in result.output
    assert "turn completed" in result.output


TOOLS_FILE = '''
from lodger import tool


@tool(group="shop")
def ship(order: str) -> str:
    """Ship an order to its customer."""
    return order


@tool(deferred=True, group="shop")
def refund(order: str, cents: int) -> str:
    """Refund part of an order's price to the customer."""
    return order
'''


def test_list_and_search_bind_a_tools_file_as_run_does(tmp_path: Path) -> None:
    tools_py = tmp_path / "shop.py"
    tools_py.write_text(TOOLS_FILE)
    result = lodger("tools", "list", "--tools", str(tools_py), "--json")
    assert result.exit_code == 0, result.output
    by_name = {row["name"]: row for row in json.loads(result.output)["tools"]}
    assert (by_name["ship"]["tier"], by_name["ship"]["group"]) == ("direct", "shop")
    assert by_name["refund"]["tier"] == "deferred"
    assert "read_file" in by_name  # the workspace tools are still there
    found = lodger("tools", "search", "refund an order", "--tools", str(tools_py), "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.output)["results"][0]["name"] == "refund"


def test_a_missing_tools_file_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["tools", "list", "--tools", str(tmp_path / "no.py")])
    assert result.exit_code == 2
    assert f"tools file {tmp_path / 'no.py'} does not exist" in result.output
