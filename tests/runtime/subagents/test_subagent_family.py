"""Families from first events, against hostile links: a link that names another session
(inherited by a fork), links that form a cycle, and a malformed link."""

from __future__ import annotations

from lodger.events import EventDraft, ForkParent, SessionStarted
from lodger.runtime.subagents import SubagentLink, family_tree, link_of
from lodger.storage import EventLog, MemoryLogStore


def _link(session: str, parent: str) -> dict[str, str]:
    return SubagentLink(
        session_id=session,
        parent_session=parent,
        parent_call="call-0-1",
        parent_offset=4,
        parent_digest="d" * 64,
        depth=1,
        root=parent,
        history="empty",
    ).to_metadata()


async def _firsts(starts: dict[str, SessionStarted]) -> dict[str, object]:
    log = EventLog(MemoryLogStore())
    out = {}
    for sid, body in starts.items():
        async with await log.open_writer(sid) as writer:
            (first,) = await writer.append(
                [EventDraft(id=f"e-{sid}", ts=1, body=body)], expected_offset=0
            )
        out[sid] = first
    return out


async def test_families_survive_inherited_cyclic_and_malformed_links() -> None:
    firsts = await _firsts(
        {
            "root": SessionStarted(),
            "kid": SessionStarted(metadata=_link("kid", "root")),
            # a fork of kid inherited kid's link: it is kid's fork, not root's subagent
            "fork": SessionStarted(
                parent=ForkParent(session_id="kid", high_water=3, digest="x"),
                metadata=_link("kid", "root"),
            ),
            # two sessions claiming each other: neither hangs the walk
            "a": SessionStarted(metadata=_link("a", "b")),
            "b": SessionStarted(metadata=_link("b", "a")),
            # a depth that is not a number: no link at all
            "bad": SessionStarted(metadata={**_link("bad", "root"), "subagent.depth": "x"}),
        }
    )
    assert link_of(firsts["bad"]) is None  # type: ignore[arg-type]
    roots = family_tree(firsts)  # type: ignore[arg-type]
    shape = {
        node.session_id: (depth, node.relation, node.parent)
        for r in roots
        for depth, node in r.walk()
    }
    assert shape["root"] == (0, "root", None)
    assert shape["kid"] == (1, "subagent", "root")
    assert shape["fork"] == (2, "fork", "kid")
    assert shape["bad"] == (0, "root", None)
    assert shape["a"][0] == shape["b"][0] == 0  # a cycle is shown as roots, never walked
    assert len(shape) == 6
