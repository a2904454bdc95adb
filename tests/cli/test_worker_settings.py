"""A worker composes each session from the project in its restored workspace: the
file's ``[model_settings]`` reach the binding, whole when trusted, only ``max_tokens``
otherwise."""

from __future__ import annotations

from pathlib import Path

from lodger.cli._control import _Binder
from lodger.providers.base import ModelSettings


def binder(trust: bool) -> _Binder:
    return _Binder(trust_projects=trust, model_spec="test", tools=[], subagents=None, spans=None)


def test_a_worker_binds_the_projects_model_settings(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(
        '[model_settings]\ntemperature = 0.3\nmax_tokens = 64\nextra = { user = "w" }\n'
    )
    trusted = binder(True)("s", None, tmp_path)
    assert trusted.model_settings == ModelSettings(
        temperature=0.3, max_tokens=64, extra={"user": "w"}
    )
    untrusted = binder(False)("s", None, tmp_path)
    assert untrusted.model_settings == ModelSettings(max_tokens=64)
