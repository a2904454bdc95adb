"""Configuration files that are not UTF-8 or nest without end are ConfigErrors that say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.errors import ConfigError
from lodger.runtime.config import load_catalog, read_config_file


def test_a_catalog_that_is_not_utf8_or_too_deep(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('[{"name": "café"}]'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 14\)"):
        load_catalog(latin1)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"catalog .* is nested too deeply to read"):
        load_catalog(deep)


def test_a_lodger_toml_that_is_a_directory_or_too_deep(tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ConfigError, match=r"cannot read configuration file .*dir\.toml"):
        read_config_file(tmp_path / "dir.toml")
    deep = tmp_path / "lodger.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="is nested too deeply to read"):
        read_config_file(deep)
