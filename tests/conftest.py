"""Settings shared by every test module."""

import pytest
from hypothesis import settings

# No per-example deadline: first calls into pydantic and shared CI runners are slow, and a
# flaky deadline says nothing about correctness.
settings.register_profile("lodger", deadline=None)
settings.load_profile("lodger")


@pytest.fixture(autouse=True)
def _no_log_key_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's LODGER_LOG_KEY* must not change what the tests (and the processes
    they start) read and write; tests that want a key set it themselves."""
    for name in ("LODGER_LOG_KEY", "LODGER_LOG_KEY_FILE", "LODGER_LOG_KEY_REQUIRED"):
        monkeypatch.delenv(name, raising=False)
