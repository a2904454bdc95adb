"""The built-in workspace tools: read, write, edit, list, grep and shell.

>>> [t.name for t in workspace_tools()]
['read_file', 'write_file', 'edit_file', 'list_files', 'grep', 'shell']
"""

from __future__ import annotations

from lodger.tools.files import edit_file, read_file, write_file
from lodger.tools.find import grep, list_files
from lodger.tools.shell import shell
from lodger.tools.spec import Tool

__all__ = [
    "edit_file",
    "grep",
    "list_files",
    "read_file",
    "shell",
    "workspace_tools",
    "write_file",
]


def workspace_tools() -> list[Tool]:
    """The built-in tools for a session with a workspace, in a stable order."""
    return [read_file, write_file, edit_file, list_files, grep, shell]
