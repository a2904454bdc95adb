"""shell and run_python through the sandbox: the default, the limits as results, failing
closed without bubblewrap, the unsandboxed choice in T1, and the lodger.toml policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger import Agent, ScriptedModel
from lodger.errors import ConfigError, ToolCallError
from lodger.events import ToolDispatched
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.config import load_sandbox_policy
from lodger.storage import Storage
from lodger.substrates.sandbox import BubblewrapSandbox, Limits, SandboxPolicy, policy_from_config
from lodger.substrates.shell import python_tool, run_python, shell, shell_tool
from lodger.tools.spec import ToolContext, ToolOutput


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o",
        workspace=ws, hidden=(ws / ".lodger",),
    )  # fmt: skip


async def test_shell_runs_in_the_sandbox_by_default(ws: Path, ctx: ToolContext) -> None:
    (ws / ".lodger").mkdir()
    (ws / ".lodger" / "log").write_text("facts\n")
    out = await shell.handler(
        {"command": "hostname; ls /root; cat /proc/1/cmdline | tr '\\0' ' '; echo > made"}, ctx
    )
    assert isinstance(out, str)
    assert out.startswith("lodger-sandbox\n")
    assert "No such file or directory" in out  # /root is not there at all
    assert out.endswith("[exit code 0]")
    assert (ws / "made").exists()
    assert shell.approval is False


@pytest.mark.slow
async def test_a_limit_settles_as_an_error_result_naming_it(ctx: ToolContext) -> None:
    small = shell_tool(SandboxPolicy(limits=Limits(memory_bytes=64 << 20)))
    out = await small.handler(
        {"command": "python3 -c \"x = [b'y' * (16 << 20) for _ in range(32)]\""}, ctx
    )
    assert isinstance(out, ToolOutput) and out.is_error
    assert "[stopped: memory limit reached; the command and its children were killed]" in (
        out.content
    )
    out = await shell.handler({"command": "exec sleep 600", "timeout_s": 0.5}, ctx)
    assert isinstance(out, ToolOutput) and out.is_error
    assert "[timed out after 0.5 s; the command and its children were killed]" in out.content


async def test_shell_fails_closed_with_a_one_line_fix_without_bubblewrap(
    ws: Path, ctx: ToolContext
) -> None:
    missing = shell_tool(sandbox=BubblewrapSandbox(executable=str(ws / "no-bwrap")))
    with pytest.raises(ToolCallError, match="apt-get install -y bubblewrap") as caught:
        await missing.handler({"command": "touch ran"}, ctx)
    assert caught.value.code == "sandbox_unavailable"
    assert not (ws / "ran").exists()


def test_running_unsandboxed_is_explicit_asks_and_is_recorded_in_t1(ctx: ToolContext) -> None:
    host = shell_tool(SandboxPolicy(backend="none"))
    assert host.approval is True
    assert host.claims is not None and shell.claims is not None
    assert [c.render() for c in host.claims({"command": "ls"}, ctx)][-1] == "actor:sandbox:none"
    assert [c.render() for c in shell.claims({"command": "ls"}, ctx)][-1] == (
        "actor:sandbox:bubblewrap"
    )
    assert "not in a sandbox" in host.description
    assert shell_tool(SandboxPolicy(approval=True)).approval is True


async def test_a_writable_git_is_chosen_in_lodger_toml_and_recorded_in_t1(
    ws: Path, ctx: ToolContext
) -> None:
    """``[sandbox] git_writable = true`` reaches the sandbox (a command commits), T1 of
    each call records it as ``actor:sandbox:git-writable``, and the tools' description
    tells the model which it has."""
    (ws / "lodger.toml").write_text("[sandbox]\ngit_writable = true\n")
    policy = load_sandbox_policy(ws)
    assert policy is not None and policy.git_writable
    assert policy.describe().endswith("; .git writable")
    assert SandboxPolicy().describe().endswith("; .git read-only")
    assert SandboxPolicy(backend="none").describe().endswith("; .git writable")
    with pytest.raises(ConfigError, match="git_writable must be true or false"):
        policy_from_config({"git_writable": "yes"})
    writable = shell_tool(policy)
    assert writable.claims is not None and shell.claims is not None
    assert [c.render() for c in writable.claims({"command": "ls"}, ctx)][-2:] == [
        "actor:sandbox:bubblewrap",
        "actor:sandbox:git-writable",
    ]
    assert "actor:sandbox:git-writable" not in [
        c.render() for c in shell.claims({"command": "ls"}, ctx)
    ]
    on_host = shell_tool(SandboxPolicy(backend="none", git_writable=True))
    assert on_host.claims is not None  # actor:sandbox:none says it all
    assert "git-writable" not in str([c.render() for c in on_host.claims({}, ctx)])
    assert ".git is read-only" not in writable.description + on_host.description
    for default in (shell, run_python):
        assert ".git is read-only" in default.description
    made = "git init -q . && git -c user.name=m -c user.email=m@x commit -q --allow-empty -m m"
    assert await writable.handler({"command": made}, ctx) == "(no output)\n[exit code 0]"
    assert (ws / ".git" / "HEAD").is_file()
    refused = await shell.handler({"command": "git config lodger.test yes"}, ctx)
    assert isinstance(refused, str) and "Read-only file system" in refused


async def test_the_t1_of_a_sandboxed_call_says_whether_git_was_writable(tmp_path: Path) -> None:
    """Through the whole pipeline: the tool_dispatched fact of a shell call names the
    backend, and a writable .git when the policy gives one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    recorded: list[tuple[str, ...]] = []
    for policy in (SandboxPolicy(), SandboxPolicy(git_writable=True)):
        script = [{"calls": [{"name": "shell", "args": {"command": "echo hi"}}]}, {"text": "ok"}]
        agent = Agent(
            model=ScriptedModel(script),
            tools=[shell_tool(policy)],
            workspace=ws,
            storage=Storage.memory(),
        )
        result = await agent.run("go")
        assert result.status == "completed"
        events = await agent.session(result.session_id).events()
        t1 = [e.body for e in events if isinstance(e.body, ToolDispatched)]
        recorded += [body.resources for body in t1]
    assert recorded == [
        ("write file:./**", "actor:sandbox:bubblewrap"),
        ("write file:./**", "actor:sandbox:bubblewrap", "actor:sandbox:git-writable"),
    ]


async def test_run_python_does_data_work_in_the_workspace(ws: Path, ctx: ToolContext) -> None:
    (ws / "data.csv").write_text("a,b\n1,2\n3,4\n")
    code = (
        "import csv, socket\n"
        "rows = list(csv.DictReader(open('data.csv')))\n"
        "total = sum(int(r['a']) + int(r['b']) for r in rows)\n"
        "open('total.txt', 'w').write(str(total))\n"
        "print('total', total)\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2); print('ONLINE')\n"
        "except OSError:\n"
        "    print('offline')\n"
    )
    out = await run_python.handler({"code": code}, ctx)
    assert out == "total 10\noffline\n[exit code 0]"
    assert (ws / "total.txt").read_text() == "10"
    failing = await python_tool().handler({"code": "raise SystemExit(4)"}, ctx)
    assert failing == "(no output)\n[exit code 4]"


def test_policy_from_lodger_toml(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_TOKEN", "tok")
    (ws / "lodger.toml").write_text(
        '[sandbox]\nbackend = "runsc"\nmemory_mb = 128\nmax_processes = 32\nenv = ["CI"]\n'
        "approval = true\n"
        '[sandbox.network]\nallow = ["pypi.org"]\n'
        '[sandbox.network.credentials."pypi.org"]\nAuthorization = "Bearer ${EXAMPLE_TOKEN}"\n'
    )
    policy = load_sandbox_policy(ws)
    assert policy is not None
    assert (policy.backend, policy.approval, policy.env) == ("runsc", True, ("CI",))
    assert policy.limits.memory_bytes == 128 << 20 and policy.limits.max_processes == 32
    assert policy.network.allows("pypi.org") and not policy.network.allows("evil.org")
    assert policy.network.headers_for("pypi.org") == {"Authorization": "Bearer tok"}
    tools = {t.name: t for t in workspace_tools(sandbox=policy)}
    assert tools["shell"].approval and tools["run_python"].approval
    with pytest.raises(ConfigError, match="looks like a credential"):
        policy_from_config({"env": ["GITHUB_TOKEN"]})
    with pytest.raises(ConfigError, match="unknown keys: network_on"):
        policy_from_config({"network_on": True})
    with pytest.raises(ConfigError, match="unknown sandbox backend"):
        policy_from_config({"backend": "docker"})


async def test_policy_env_passes_named_variables_only(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "yes")
    monkeypatch.setenv("OTHER", "no")
    out = await shell_tool(SandboxPolicy(env=("CI",))).handler(
        {"command": 'echo "ci=$CI other=${OTHER:-unset}"'}, ctx
    )
    assert out == "ci=yes other=unset\n[exit code 0]"
