"""The runtime: one composition every door uses (library, CLI, host, workers).

``Project`` (a workspace and its ``lodger.toml``) plus ``Overrides`` (an entry point's
flags and callbacks) is composed by :func:`compose` into what a run binds; a
``StorageLocation`` names where its sessions live. Names load on first use, so a
command that only needs a location does not import the providers.
"""

from typing import TYPE_CHECKING, Any

from lodger._core import lazy as _lazy

if TYPE_CHECKING:
    from lodger.runtime.composition import DEFAULT_MAX_STEPS, MODEL_ENVVAR, Overrides, compose
    from lodger.runtime.location import StorageLocation
    from lodger.runtime.project import Project

__all__ = [
    "DEFAULT_MAX_STEPS",
    "MODEL_ENVVAR",
    "Overrides",
    "Project",
    "StorageLocation",
    "compose",
]

_EXPORTS = {
    "DEFAULT_MAX_STEPS": "lodger.runtime.composition",
    "MODEL_ENVVAR": "lodger.runtime.composition",
    "Overrides": "lodger.runtime.composition",
    "compose": "lodger.runtime.composition",
    "StorageLocation": "lodger.runtime.location",
    "Project": "lodger.runtime.project",
}


def __getattr__(name: str) -> Any:
    return _lazy.resolve(__name__, _EXPORTS, globals(), name)
