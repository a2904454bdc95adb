from __future__ import annotations

import shutil

import pytest

from lodger.substrates.sandbox import BubblewrapSandbox, RunscSandbox, Sandbox


def _backends() -> list[object]:
    return [
        pytest.param("bubblewrap", id="bubblewrap"),
        pytest.param("runsc", id="runsc", marks=pytest.mark.slow),  # fast lane: bubblewrap only
    ]


@pytest.fixture(params=_backends())
def box(request: pytest.FixtureRequest) -> Sandbox:
    name = request.param
    executable = {"bubblewrap": "bwrap", "runsc": "runsc"}[name]
    # CI installs both (scripts/install.sh); a missing one is a failure, not a skip.
    assert shutil.which(executable), f"{executable} is not installed: run scripts/install.sh"
    return BubblewrapSandbox() if name == "bubblewrap" else RunscSandbox()
