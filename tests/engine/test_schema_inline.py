"""Where a call's schema check runs: on the loop when the compiled quick check vouches
for the arguments (nested parameters included) or when the full validator is compiled
and the arguments are small; on a worker thread for a schema's first full check and for
large arguments. Worker-thread round trips are counted on a real thread pool set as
the loop's default executor (``asyncio.to_thread`` goes through it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

from lodger.engine.checks import INLINE_VALIDATION_LIMIT, schema_problems_from_loop
from lodger.tools import Tool, tool


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def _hops(t: Tool, arguments: dict[str, Any], size: int | None) -> tuple[list[str], int]:
    """The problems found from the loop, and how many worker-thread round trips it took."""
    pool = CountingPool()

    async def check() -> list[str]:
        asyncio.get_running_loop().set_default_executor(pool)
        return await schema_problems_from_loop(t, arguments, size=size)

    try:
        return asyncio.run(check()), pool.submitted
    finally:
        pool.shutdown()


class Point(BaseModel):
    x: int
    labels: list[str] = []


def _nested_tool(marker: str) -> Tool:
    """A tool with list, dict and model parameters; ``marker`` makes its schema one no
    other test has compiled (the validator cache is the process's)."""

    @tool(name=f"plot_{marker}")
    def plot(points: list[Point], style: dict[str, int], title: str = marker) -> str:
        """Plot points."""
        return ""

    return plot


def test_a_valid_nested_call_takes_no_thread_hop() -> None:
    t = _nested_tool("valid")
    arguments = {"points": [{"x": 1, "labels": ["a"]}], "style": {"width": 2}}
    assert _hops(t, arguments, len(json.dumps(arguments))) == ([], 0)


def test_an_invalid_call_hops_once_per_schema_then_is_checked_inline() -> None:
    t = _nested_tool("invalid")
    arguments = {"points": [{"x": "one"}], "style": {}}
    size = len(json.dumps(arguments))
    first, first_hops = _hops(t, arguments, size)
    again, again_hops = _hops(t, arguments, size)
    assert first_hops == 1 and again_hops == 0
    assert first == again and len(first) == 1 and "points/0/x" in first[0], first


def test_large_or_unsized_arguments_are_fully_checked_off_the_loop() -> None:
    t = _nested_tool("large")
    small = {"points": [{"x": "one"}], "style": {}}
    _hops(t, small, len(json.dumps(small)))  # compiles the validator
    large = {"points": [{"x": "one", "labels": ["y" * INLINE_VALIDATION_LIMIT]}], "style": {}}
    problems, hops = _hops(t, large, len(json.dumps(large)))
    assert hops == 1 and len(problems) == 1, problems
    problems, hops = _hops(t, small, None)  # a hook's rewrite: its size is not known
    assert hops == 1 and len(problems) == 1, problems
