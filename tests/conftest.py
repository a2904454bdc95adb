"""Settings shared by every test module."""

from hypothesis import settings

# No per-example deadline: first calls into pydantic and shared CI runners are slow, and a
# flaky deadline says nothing about correctness.
settings.register_profile("lodger", deadline=None)
settings.load_profile("lodger")
