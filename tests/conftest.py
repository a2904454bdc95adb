"""Settings shared by every test module."""

import os

import pytest
from hypothesis import settings

# No per-example deadline: first calls into pydantic and shared CI runners are slow, and a
# flaky deadline says nothing about correctness.
settings.register_profile("lodger", deadline=None)
# The fast lane (`scripts/check.sh --fast` sets LODGER_FAST_LANE=1) tries fewer examples
# where a test does not set its own count; CI runs the full profile.
settings.register_profile("fast", deadline=None, max_examples=20)
settings.load_profile("fast" if os.environ.get("LODGER_FAST_LANE") == "1" else "lodger")


@pytest.fixture(autouse=True)
def _no_log_key_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's LODGER_LOG_KEY* must not change what the tests (and the processes
    they start) read and write; tests that want a key set it themselves."""
    for name in ("LODGER_LOG_KEY", "LODGER_LOG_KEY_FILE", "LODGER_LOG_KEY_REQUIRED"):
        monkeypatch.delenv(name, raising=False)
