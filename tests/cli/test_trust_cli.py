"""``lodger trust`` and ``--trust``: a workspace's lodger.toml applies whole only once the
user trusted that exact content; until then it only narrows, and the CLI says so."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lodger.cli import main
from lodger.runtime.trust import TrustStore

SCRIPT = [{"calls": [{"name": "shell", "args": {"command": "echo hi"}}]}, {"text": "done"}]
TOML = '[permissions]\nallow = ["shell"]\nask = ["shell(echo *)"]\n'


def _runner() -> CliRunner:
    return CliRunner(env={"LODGER_STORE": None, "COLUMNS": "300"})


def _run(ws: Path, *extra: str) -> tuple[int, str, str]:
    (ws / "script.json").write_text(json.dumps(SCRIPT))
    out = _runner().invoke(
        main,
        ["run", "go", "--model", f"script:{ws / 'script.json'}", "--workspace", str(ws),
         "--state", str(ws / ".state"), "--json", *extra],
    )  # fmt: skip
    return out.exit_code, out.stdout, out.stderr


def test_an_untrusted_file_narrows_and_says_so_in_json(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(TOML)
    code, stdout, stderr = _run(tmp_path)
    notices = [json.loads(line)["notice"] for line in stderr.splitlines() if line.strip()]
    assert any("is not trusted" in n and "1 allow rule(s)" in n for n in notices), stderr
    facts = [json.loads(line) for line in stdout.splitlines()]
    decided = [f["event"]["body"] for f in facts if f.get("type") == "fact"
               and f["event"]["body"]["kind"] == "permission_decided"]  # fmt: skip
    # the ask rule (narrowing) applied, not the allow rule: nobody answers under --json,
    # so it is denied (without the file, shell in its sandbox is allowed)
    assert [d["decision"] for d in decided] == ["deny"], decided
    assert code == 0


def test_trust_records_the_content_and_a_change_needs_it_again(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(TOML.replace('ask = ["shell(echo *)"]\n', ""))
    made = _runner().invoke(main, ["trust", str(tmp_path), "--json"])
    assert made.exit_code == 0, made.output
    record = json.loads(made.stdout)
    assert record["trusted"] is True and len(record["sha256"]) == 64
    assert TrustStore.default().trusts(tmp_path / "lodger.toml")
    code, _, stderr = _run(tmp_path)
    assert code == 0 and "not trusted" not in stderr
    (tmp_path / "lodger.toml").write_text(TOML)
    assert not TrustStore.default().trusts(tmp_path / "lodger.toml")
    revoked = _runner().invoke(main, ["trust", str(tmp_path), "--revoke"])
    assert revoked.exit_code == 0 and revoked.stdout.startswith("revoked: ")


def test_trust_for_one_run_records_nothing(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(TOML)
    code, _, stderr = _run(tmp_path, "--trust")
    assert code == 0 and "not trusted" not in stderr
    assert not TrustStore.default().path.exists()


def test_a_file_with_a_bad_key_is_not_trusted(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text('[permissions]\nalow = ["shell"]\n')
    refused = _runner().invoke(main, ["trust", str(tmp_path)])
    assert refused.exit_code == 2 and "unknown key 'permissions.alow'" in refused.output
    assert not TrustStore.default().path.exists()
