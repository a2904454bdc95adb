"""Confinement of paths to the workspace, file hashes and the workspace identity."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from lodger.errors import ToolCallError
from lodger.tools.workspace import (
    resolve_in_workspace,
    resolve_workspace_root,
    sha256_of_file,
    workspace_id,
    workspace_relative,
)

OUTSIDE_MESSAGE = "is outside the workspace; use a path relative to the workspace root"


# ---------------------------------------------------------------- accepted paths


def test_relative_path_resolves_under_the_root(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("x")
    assert resolve_in_workspace(ws, "src/a.py", must_exist=True) == ws / "src" / "a.py"


def test_dotdot_that_stays_inside_is_normalized(ws: Path) -> None:
    (ws / "src").mkdir()
    assert resolve_in_workspace(ws, "src/../b.txt", must_exist=False) == ws / "b.txt"


def test_absolute_path_inside_the_root_is_accepted(ws: Path) -> None:
    (ws / "a.txt").write_text("x")
    assert resolve_in_workspace(ws, str(ws / "a.txt"), must_exist=True) == ws / "a.txt"


def test_dot_is_the_root_itself(ws: Path) -> None:
    resolved = resolve_in_workspace(ws, ".", must_exist=True)
    assert resolved == ws
    assert workspace_relative(ws, resolved) == "."


def test_symlinks_inside_the_workspace_resolve_to_their_target(ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "real" / "f.txt").write_text("x")
    (ws / "alias").symlink_to(ws / "real")
    (ws / "f-link.txt").symlink_to("real/f.txt")
    assert resolve_in_workspace(ws, "alias/f.txt", must_exist=True) == ws / "real" / "f.txt"
    assert resolve_in_workspace(ws, "f-link.txt", must_exist=True) == ws / "real" / "f.txt"
    # A new file under an inside symlinked directory is fine too.
    assert resolve_in_workspace(ws, "alias/new.txt", must_exist=False) == ws / "real" / "new.txt"


def test_a_workspace_given_through_a_symlink_accepts_both_spellings(
    ws: Path, tmp_path: Path
) -> None:
    link_root = tmp_path / "ws-link"
    link_root.symlink_to(ws)
    (ws / "a.txt").write_text("x")
    assert resolve_in_workspace(link_root, "a.txt", must_exist=True) == ws / "a.txt"
    assert resolve_in_workspace(link_root, str(link_root / "a.txt"), must_exist=True) == (
        ws / "a.txt"
    )
    assert resolve_in_workspace(link_root, str(ws / "a.txt"), must_exist=True) == ws / "a.txt"


def test_new_file_in_missing_directories_is_accepted_when_not_required(ws: Path) -> None:
    assert resolve_in_workspace(ws, "x/y/z.txt", must_exist=False) == ws / "x" / "y" / "z.txt"


# ---------------------------------------------------------------- refused paths


def test_dotdot_escape_is_refused_with_an_actionable_message(ws: Path) -> None:
    with pytest.raises(ToolCallError) as info:
        resolve_in_workspace(ws, "../x", must_exist=False)
    assert str(info.value) == f"path '../x' {OUTSIDE_MESSAGE}"


def test_dotdot_escape_after_a_subdirectory_is_refused(ws: Path) -> None:
    (ws / "src").mkdir()
    with pytest.raises(ToolCallError, match="outside the workspace"):
        resolve_in_workspace(ws, "src/../../outside/secret.txt", must_exist=False)


def test_absolute_path_outside_is_refused(ws: Path, outside: Path) -> None:
    with pytest.raises(ToolCallError, match="outside the workspace"):
        resolve_in_workspace(ws, str(outside / "secret.txt"), must_exist=True)
    with pytest.raises(ToolCallError, match="outside the workspace"):
        resolve_in_workspace(ws, "/etc/passwd", must_exist=False)


def test_sibling_with_a_common_name_prefix_is_outside(ws: Path, tmp_path: Path) -> None:
    sibling = tmp_path / "ws-other"
    sibling.mkdir()
    with pytest.raises(ToolCallError, match="outside the workspace"):
        resolve_in_workspace(ws, str(sibling / "f.txt"), must_exist=False)


def test_symlinked_file_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "leak.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "leak.txt", must_exist=True)


def test_symlinked_directory_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "out", must_exist=True)
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "out/secret.txt", must_exist=True)


def test_new_file_under_a_symlinked_directory_pointing_outside_is_refused(
    ws: Path, outside: Path
) -> None:
    (ws / "out").symlink_to(outside)
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "out/new/file.txt", must_exist=False)


def test_intermediate_symlinked_directory_pointing_outside_is_refused(
    ws: Path, outside: Path
) -> None:
    (ws / "inner").mkdir()
    (ws / "inner" / "link").symlink_to(outside)
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "inner/link/secret.txt", must_exist=False)


def test_dangling_symlink_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    # Writing through it would create the target outside the workspace.
    (ws / "dangling").symlink_to(outside / "does-not-exist-yet.txt")
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "dangling", must_exist=False)


def test_relative_symlink_climbing_out_is_refused(ws: Path, outside: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub" / "up").symlink_to("../../outside")
    with pytest.raises(ToolCallError, match="through a symlink"):
        resolve_in_workspace(ws, "sub/up/secret.txt", must_exist=False)


def test_nul_byte_and_empty_path_are_refused(ws: Path) -> None:
    with pytest.raises(ToolCallError, match="NUL byte"):
        resolve_in_workspace(ws, "a\x00b", must_exist=False)
    with pytest.raises(ToolCallError, match="path is empty"):
        resolve_in_workspace(ws, "", must_exist=False)


def test_missing_path_is_refused_when_it_must_exist(ws: Path) -> None:
    with pytest.raises(ToolCallError, match=re.escape("'nope.txt' does not exist")):
        resolve_in_workspace(ws, "nope.txt", must_exist=True)


def test_refusals_are_tool_call_errors_with_a_stable_code(ws: Path) -> None:
    with pytest.raises(ToolCallError) as info:
        resolve_in_workspace(ws, "/", must_exist=False)
    assert info.value.code == "path_outside"


def test_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ToolCallError, match="not a directory"):
        resolve_workspace_root(tmp_path / "missing")


# ---------------------------------------------------------------- canonical names


def test_aliases_share_one_workspace_relative_name(ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "alias").symlink_to("real")
    names = {
        workspace_relative(ws, resolve_in_workspace(ws, p, must_exist=False))
        for p in ("real/f.txt", "alias/f.txt", "./real/../real/f.txt", str(ws / "real/f.txt"))
    }
    assert names == {"real/f.txt"}


# ---------------------------------------------------------------- hashes and identity


def test_sha256_of_file(ws: Path) -> None:
    (ws / "a.bin").write_bytes(b"\x00\x01hello")
    assert sha256_of_file(ws / "a.bin") == hashlib.sha256(b"\x00\x01hello").hexdigest()
    assert sha256_of_file(ws / "absent") is None


def test_workspace_id_is_stable_and_alias_independent(ws: Path, tmp_path: Path) -> None:
    link = tmp_path / "ws-link"
    link.symlink_to(ws)
    assert workspace_id(ws) == workspace_id(ws)
    assert workspace_id(link) == workspace_id(ws)
    assert len(workspace_id(ws)) == 64


def test_workspace_id_differs_for_another_directory_under_the_same_name(
    ws: Path, tmp_path: Path
) -> None:
    before = workspace_id(ws)
    other = tmp_path / "other"
    other.mkdir()
    os.rmdir(ws)
    # `other` keeps its own inode when renamed, so the name is the same but the directory is not.
    other.rename(ws)
    assert workspace_id(ws) != before


def test_workspace_id_differs_between_directories(ws: Path, outside: Path) -> None:
    assert workspace_id(ws) != workspace_id(outside)
