"""Media in a run: the bytes the context needs, what the model takes, a tool's media.

The projection (``lodger.context``) is a pure fold and reads the bytes of a turn's
attachments and of a tool's media results from the session state's ``media``;
``load_media`` reads the ones it does not hold yet from the artifact store before a step
projects, so an opened, resumed or forked session gives the model the same parts as the
run that recorded them (a missing artifact fails closed, naming it).
``unsupported_media`` is the check before a request: a model takes the media kinds its
class declares (``media_kinds``; none when it declares nothing).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from lodger.engine.state import SessionState
from lodger.errors import StorageError, UsageError
from lodger.events import ArtifactRef
from lodger.media import BinaryContent, MediaLimits, check_media, load_artifact, media_kind
from lodger.providers.base import Model
from lodger.storage.artifacts import ArtifactStore

__all__ = ["load_media", "store_tool_media", "unsupported_media"]


async def load_media(state: SessionState, artifacts: ArtifactStore) -> None:
    """Read into ``state.media`` every artifact the next projection needs."""
    for sha256, what in state.projector.needed_media().items():
        state.media[sha256] = await load_artifact(
            sha256, artifacts, what=what, session_id=state.session_id
        )


def unsupported_media(model: Model, state: SessionState) -> str | None:
    """Why ``model`` cannot be sent the context's media (None: it can)."""
    types = state.projector.media_types
    if not types:
        return None
    takes: frozenset[str] = getattr(model, "media_kinds", frozenset())
    refused = sorted(t for t in types if media_kind(t) not in takes)
    if not refused:
        return None
    spec = getattr(model, "spec", type(model).__name__)
    takes_text = ", ".join(sorted(takes)) if takes else "text only"
    return (
        f"model {spec!r} does not take {', '.join(refused)} input (it takes {takes_text}); "
        "nothing was sent: use a model that reads images and documents, or leave the "
        "media out"
    )


async def store_tool_media(
    parts: Sequence[BinaryContent],
    artifacts: ArtifactStore,
    media: MutableMapping[str, bytes],
    *,
    tool: str,
    limits: MediaLimits,
) -> tuple[tuple[ArtifactRef, ...], str]:
    """The artifacts of the media a tool returned, and a note for its result about any
    that could not be attached (the call happened: its T2 records it all the same)."""
    refs: list[ArtifactRef] = []
    notes: list[str] = []
    for part in parts:
        try:
            if part.media_type == "text/plain":
                raise UsageError("text/plain media from a tool travel as its text result")
            check_media(part.data, part.media_type, name=part.name, limits=limits)
            ref = await artifacts.put(part.data, media_type=part.media_type)
        except (UsageError, StorageError) as exc:
            notes.append(f"[{tool}'s {part.media_type} was not attached: {exc.message}]")
            continue
        media[ref.sha256] = part.data
        refs.append(ref)
    return tuple(refs), "\n".join(notes)
