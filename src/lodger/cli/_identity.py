"""Who decides at a terminal: ``cli:<user>``, the OS user the process runs as.

The name comes from the password database by the process's uid (not ``$USER``, which
any command can set), else the uid itself; it goes into ``permission_decided.who`` and
``operator_decision.who``.
"""

from __future__ import annotations

import os
import pwd

__all__ = ["cli_user"]


def cli_user() -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no entry (a container's): the number names it
        name = str(uid)
    return f"cli:{name}"
