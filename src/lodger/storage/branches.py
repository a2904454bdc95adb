"""A session's branches: which log a session's name leads to after a rewind.

A rewind (:mod:`lodger.runtime.rewind`) never edits a log. It starts a copy-free fork at
the prefix it goes back to (:mod:`lodger.storage.forks`) and makes that fork the session's
*current branch*. The branches of session ``S`` are the sessions ``S..r1``, ``S..r2``, ...
in the order they were made (an id lodger makes never holds ``..``: a UUIDv7 has no dot).
The name ``S`` leads to the newest of them that exists, or to ``S`` itself when it was
never rewound.

No pointer is kept beside the logs: a branch's first append (its ``session_started`` and
its ``rewound`` fact, committed together) *is* the pointer. A crash cannot leave a pointer
that disagrees with the logs, and every backend (SQLite, object store, memory) has it
without a table of its own. Finding the newest branch costs ``2 log2(n)`` indexed lookups
for ``n`` branches (one for a session never rewound).

An id that names a branch (``S..r2``) leads to that branch exactly: a branch left behind
stays readable (``lodger log show S..r1``) and is a session of its own; ``S..r0`` names
the session's first log, ``S`` itself. Rewinding back to a branch starts a new branch that
shares its whole log, so the newest branch is always the current one.
"""

from __future__ import annotations

import re

from lodger.errors import UsageError
from lodger.storage.eventlog import EventLog
from lodger.storage.logstore import check_session_id

__all__ = [
    "branch_id",
    "branch_number",
    "current_branch",
    "names_a_branch",
    "next_branch",
    "root_of",
]

_BRANCH = re.compile(r"^(?P<root>.+)\.\.r(?P<n>[1-9][0-9]*)$")
_FIRST = "..r0"
_MAX_ID = 128


def root_of(session_id: str) -> str:
    """The session a branch belongs to (``S`` for ``S..r3`` and ``S..r0``; ``S`` for ``S``)."""
    found = _BRANCH.fullmatch(session_id)
    if found:
        return found["root"]
    if session_id.endswith(_FIRST) and len(session_id) > len(_FIRST):
        return session_id[: -len(_FIRST)]
    return session_id


def names_a_branch(name: str) -> bool:
    """Whether ``name`` names one branch exactly (``S..r2``, ``S..r0``), not a session."""
    return root_of(name) != name


def branch_number(session_id: str) -> int:
    """``3`` for ``S..r3``; ``0`` for the session's first log ``S``."""
    found = _BRANCH.fullmatch(session_id)
    return int(found["n"]) if found else 0  # S and S..r0 are the first log


def branch_id(root: str, number: int) -> str:
    """The id of branch ``number`` of session ``root`` (``root`` itself for 0)."""
    if number == 0:
        return root
    made = f"{root}..r{number}"
    if len(made) > _MAX_ID:
        raise UsageError(
            f"session {root!r} cannot be rewound: its branch id {made[:40]}... would be longer "
            f"than {_MAX_ID} characters",
            hint="fork the session under a shorter id and rewind the fork",
            code="rewind_target",
            session_id=root,
        )
    return check_session_id(made)


async def _exists(log: EventLog, root: str, number: int) -> bool:
    made = f"{root}..r{number}"
    return len(made) <= _MAX_ID and await log.exists(made)


async def _newest(log: EventLog, root: str) -> int:
    """The highest branch number of ``root`` whose log exists (0 when none does).
    Branches are made in order, so existence is monotone in the number: gallop, then
    bisect."""
    if not await _exists(log, root, 1):
        return 0
    low, high = 1, 2
    while await _exists(log, root, high):
        low, high = high, high * 2
    while high - low > 1:  # low exists, high does not
        middle = (low + high) // 2
        if await _exists(log, root, middle):
            low = middle
        else:
            high = middle
    return low


async def current_branch(log: EventLog, name: str) -> str:
    """The log ``name`` leads to: for a session's name, its newest branch (itself when it
    was never rewound); for a branch's id, that branch."""
    check_session_id(name)
    if _BRANCH.fullmatch(name):
        return name
    if name.endswith(_FIRST) and len(name) > len(_FIRST):
        return name[: -len(_FIRST)]
    return branch_id(name, await _newest(log, name))


async def next_branch(log: EventLog, name: str) -> str:
    """The id the session's next branch takes."""
    root = root_of(check_session_id(name))
    return branch_id(root, await _newest(log, root) + 1)
