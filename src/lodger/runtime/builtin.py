"""The built-in workspace tools: read, write, edit, list, grep, shell and run_python.

>>> [t.name for t in workspace_tools()]
['read_file', 'write_file', 'edit_file', 'list_files', 'grep', 'shell', 'run_python']

``workspace_tools(sandbox=policy)`` runs shell and run_python under another
``SandboxPolicy`` (``[sandbox]`` in lodger.toml; see ``lodger.substrates.sandbox.policy``).
The file tools write no git directory (``.git``) unless that policy lets commands write
it too (``git_writable = true``, or a backend that does not confine).
"""

from __future__ import annotations

from lodger.substrates.sandbox.policy import SandboxPolicy
from lodger.substrates.shell import python_tool, run_python, shell, shell_tool
from lodger.tools.files import edit_file, read_file, write_file, writing_tools
from lodger.tools.find import grep, list_files
from lodger.tools.spec import Tool

__all__ = [
    "edit_file",
    "grep",
    "list_files",
    "read_file",
    "run_python",
    "shell",
    "workspace_tools",
    "write_file",
]


def workspace_tools(*, sandbox: SandboxPolicy | None = None) -> list[Tool]:
    """The built-in tools for a session with a workspace, in a stable order."""
    if sandbox is None:
        return [read_file, write_file, edit_file, list_files, grep, shell, run_python]
    writes, edits = writing_tools(git_writable=sandbox.git_writable or not sandbox.confined)
    return [
        read_file,
        writes,
        edits,
        list_files,
        grep,
        shell_tool(sandbox),
        python_tool(sandbox),
    ]
