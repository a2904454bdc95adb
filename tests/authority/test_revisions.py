"""Revisioned state: compare-and-swap; a stale write is an error the model can act on."""

from __future__ import annotations

import pytest

from lodger.authority import RevisionStore
from lodger.errors import StaleRevisionError, ToolCallError


def test_writes_bump_the_revision_and_stale_writes_are_refused() -> None:
    notes: RevisionStore[str] = RevisionStore(initial=str, what="the notes")
    assert notes.read("s1").revision == 0 and notes.read("s1").value == ""
    first = notes.write("s1", "one", expected_revision=0, owner="c1")
    assert (first.revision, first.value, first.written_by) == (1, "one", "c1")
    with pytest.raises(StaleRevisionError) as info:
        notes.write("s1", "lost update", expected_revision=0, owner="c2")
    error = info.value
    assert isinstance(error, ToolCallError)  # a result the model sees, not a crash
    assert (error.key, error.expected, error.current) == ("s1", 0, 1)
    assert "the notes is at revision 1, not 0" in error.message
    assert "last written by call 'c1'" in error.message
    assert "revision 1" in (error.hint or "")
    assert notes.read("s1").value == "one"  # the stale write changed nothing
    assert notes.write("s1", "two", expected_revision=1, owner="c2").revision == 2


def test_keys_are_independent_and_statistics_count_conflicts() -> None:
    todo: RevisionStore[tuple[str, ...]] = RevisionStore(initial=tuple)
    todo.write("s1", ("a",), expected_revision=0, owner="c1")
    todo.write("s2", ("b",), expected_revision=0, owner="c2")  # another session: revision 0
    with pytest.raises(StaleRevisionError):
        todo.write("s1", ("c",), expected_revision=2, owner="c3")  # from the future: refused
    stats = todo.statistics()
    assert (stats.authority, stats.acquisitions, stats.conflicts) == ("revisions", 2, 1)
    assert {(h.owner, h.resources) for h in stats.holders} == {
        ("c1", ("s1@1",)),
        ("c2", ("s2@1",)),
    }
