"""``Project`` and ``compose``: a lodger.toml read once, trusted or only narrowing, and
the one composition every door binds through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lodger.errors import ConfigError
from lodger.providers import ScriptedModel
from lodger.runtime import Overrides, Project, compose
from lodger.runtime.composition import bound_tools, model_spec_for
from lodger.runtime.trust import TrustStore
from lodger.substrates.sandbox.policy import SandboxPolicy
from lodger.tools.mcp import McpServerConfig

WIDE = """
model = "openai:gpt-4.1"
[permissions]
allow = ["shell(git *)"]
ask = ["write_file"]
deny = ["shell(rm *)"]
[sandbox]
backend = "none"
memory_mb = 99999
approval = true
max_processes = 8
env = ["CI"]
[sandbox.network]
allow = ["pypi.org"]
[mcp.servers.git]
command = "mcp-server-git"
[limits]
max_steps = 80
"""


def _decisions(project: Project) -> list[tuple[str, str]]:
    return [(r.pattern, r.decision) for r in project.rules]


def test_a_trusted_project_applies_the_whole_file(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(WIDE.replace('backend = "none"\n', ""))
    project = Project.load(tmp_path, trusted=True)
    assert project.trusted and project.workspace == tmp_path.resolve()
    assert project.model == "openai:gpt-4.1"
    assert [d for _, d in _decisions(project)] == ["deny", "ask", "allow"]
    assert project.sandbox is not None and project.sandbox.network.allows("pypi.org")
    assert [s.name for s in project.mcp] == ["git"] and project.max_steps == 80
    assert project.ignored == ()


def test_an_untrusted_project_only_narrows(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(WIDE)
    project = Project.load(tmp_path, trusted=False)
    assert project.model is None and project.mcp == ()
    assert [d for _, d in _decisions(project)] == ["deny", "ask"]  # no allow rule
    policy = project.sandbox
    assert policy is not None
    assert policy.confined and policy.backend == "bubblewrap"  # "none" would unconfine
    assert policy.network.allow == () and policy.env == ()
    assert policy.approval is True and policy.limits.max_processes == 8  # stricter: kept
    default = SandboxPolicy().limits
    assert policy.limits.memory_bytes == default.memory_bytes  # looser: the default's
    said = "; ".join(project.ignored)
    for phrase in ("its model", "1 allow rule", "1 MCP server", "backend", "env", "network"):
        assert phrase in said, said
    assert "memory_bytes" in said


def test_an_untrusted_project_cannot_make_git_writable(tmp_path: Path) -> None:
    """``git_writable`` widens what a command may do (leave code the host's git runs), so
    a file lodger does not trust is not followed on it; a trusted one is."""
    (tmp_path / "lodger.toml").write_text("[sandbox]\ngit_writable = true\nmemory_mb = 256\n")
    untrusted = Project.load(tmp_path, trusted=False)
    assert untrusted.sandbox is not None and untrusted.sandbox.git_writable is False
    assert untrusted.sandbox.limits.memory_bytes == 256 << 20  # what narrows still applies
    assert "[sandbox] git_writable" in "; ".join(untrusted.ignored)
    assert Project.load(tmp_path).sandbox.git_writable is False  # type: ignore[union-attr]
    trusted = Project.load(tmp_path, trusted=True)
    assert trusted.sandbox is not None and trusted.sandbox.git_writable is True
    assert trusted.ignored == ()


def test_an_untrusted_file_may_lower_the_step_limit_but_not_raise_it(tmp_path: Path) -> None:
    model = ScriptedModel([])
    (tmp_path / "lodger.toml").write_text("[limits]\nmax_steps = 80\n")
    raised = compose(Project.load(tmp_path, trusted=False), Overrides(model=model, max_steps=20))
    assert raised.max_steps == 20
    (tmp_path / "lodger.toml").write_text("[limits]\nmax_steps = 5\n")
    lowered = compose(Project.load(tmp_path, trusted=False), Overrides(model=model, max_steps=20))
    assert lowered.max_steps == 5
    # trusted: the flag wins over the file, the file over the default
    assert (
        compose(
            Project.load(tmp_path, trusted=True), Overrides(model=model, max_steps=20)
        ).max_steps
        == 20
    )
    assert compose(Project.load(tmp_path, trusted=True), Overrides(model=model)).max_steps == 5
    assert compose(Project.none(), Overrides(model=model)).max_steps == 50


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[limits]\nmax_steps = 0\n", "at least 1"),
        ("[limits]\nsteps = 3\n", "unknown key 'limits.steps'"),
        ("sandbox = 3\n", "valid dictionary"),
        ("[permissions]\ndeny = [1]\n", "permissions.deny.0"),
    ],
)
def test_a_bad_file_is_one_config_error_trusted_or_not(
    tmp_path: Path, text: str, needle: str
) -> None:
    (tmp_path / "lodger.toml").write_text(text)
    for trusted in (True, False):
        with pytest.raises(ConfigError) as caught:
            Project.load(tmp_path, trusted=trusted)
        assert needle in caught.value.message


def test_compose_binds_the_projects_rules_tools_and_servers(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(
        '[permissions]\ndeny = ["shell(rm *)"]\n[sandbox]\nmemory_mb = 256\n'
        '[mcp.servers.git]\ncommand = "mcp-server-git"\n[mcp.servers.docs]\n'
        'url = "http://127.0.0.1:1/mcp"\n'
    )
    flag = McpServerConfig(name="docs", url="http://127.0.0.1:2/mcp")
    binding = compose(
        Project.load(tmp_path, trusted=True),
        Overrides(model=ScriptedModel([]), mcp=[flag], approve_all=True),
    )
    assert binding.workspace == tmp_path.resolve()
    assert [(r.pattern, r.decision) for r in binding.permissions.rules] == [("shell", "deny")]
    assert binding.permissions.approve_all
    shell = next(t for t in binding.tools if t.name == "shell")
    assert shell is not None
    # the flag's server replaces the file's of the same name
    assert {s.name: s.url for s in binding.mcp} == {"git": None, "docs": flag.url}
    tools, _ = bound_tools(Project.none())
    assert tools == []  # no workspace: no workspace tools


def test_the_model_comes_from_flags_then_the_session_then_the_file(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text('model = "test"\n')
    project = Project.load(tmp_path, trusted=True)
    assert model_spec_for(project, Overrides(model="x:1", recorded_model="y:2")) == "x:1"
    assert model_spec_for(project, Overrides(recorded_model="y:2")) == "y:2"
    assert model_spec_for(project, Overrides(fallback_model="z:3")) == "test"
    assert model_spec_for(Project.none(), Overrides(fallback_model="z:3")) == "z:3"
    with pytest.raises(ConfigError, match="no model given"):
        compose(Project.none())


def test_without_a_word_a_file_is_trusted_only_as_recorded(tmp_path: Path) -> None:
    """``Project.load(ws)`` asks the user's trust records (``lodger trust``): the exact
    content at that path, nothing else; an untrusted file still narrows."""
    text = '[permissions]\nallow = ["shell"]\ndeny = ["shell(rm *)"]\n'
    config = tmp_path / "lodger.toml"
    config.write_text(text)
    store = TrustStore.default()
    assert not Project.load(tmp_path).trusted
    store.trust(config)
    assert Project.load(tmp_path).trusted
    config.write_text(text + "# one more line\n")
    assert not Project.load(tmp_path).trusted  # changed: trusted again only by the user
    store.trust(config)
    assert Project.load(tmp_path).trusted
    assert store.revoke(config) and not store.revoke(config)
    assert not Project.load(tmp_path).trusted
    # a workspace whose lodger.toml is a symlink to a trusted file is another record
    other = tmp_path / "other"
    other.mkdir()
    store.trust(config)
    (other / "lodger.toml").symlink_to(config)
    assert not Project.load(other).trusted
    # the records live in the user's config directory, not in either workspace
    assert store.path.is_relative_to(Path(os.environ["LODGER_CONFIG_DIR"]))


def test_damaged_trust_records_are_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text("[limits]\nmax_steps = 3\n")
    store = TrustStore.default()
    store.directory.mkdir(parents=True, exist_ok=True)
    store.path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"trust records .* are damaged"):
        Project.load(tmp_path)


def test_a_decision_names_the_whole_rule_arguments_included(tmp_path: Path) -> None:
    """The reason said ``rule 'shell'`` for ``deny = ["shell(rm *)"]``, which reads as if
    every shell call were denied."""
    (tmp_path / "lodger.toml").write_text('[permissions]\ndeny = ["shell(rm *)"]\n')
    binding = compose(Project.load(tmp_path, trusted=False), Overrides(model=ScriptedModel([])))
    shell = next(t for t in binding.tools if t.name == "shell")
    assert binding.permissions.decide(shell, {"command": "rm victim.txt"}) == (
        "deny",
        "rule 'shell(rm *)'",
    )
    assert binding.permissions.decide(shell, {"command": "ls"}) == ("allow", "default")
