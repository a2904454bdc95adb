"""No function in lodger is longer than ``LIMIT`` lines unless it reads as one state machine.

A function's length runs from its ``def`` line (decorators excluded) to its last line,
docstring and comments included. The few functions allowed to be longer are named in
``STATE_MACHINES`` with the reason; an entry whose function is gone or short again fails
too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path

import lodger

SRC = Path(lodger.__file__).parent
LIMIT = 80

#: ``module.qualname`` -> why it may be longer than ``LIMIT`` (one line)
STATE_MACHINES: dict[str, str] = {}


@dataclass(frozen=True)
class Measured:
    qualname: str  # ``module.qualname``, nested functions as ``outer.<locals>.inner``
    line: int  # of the ``def``
    length: int  # lines, ``def`` to last line


def measure(source: str, module: str) -> list[Measured]:
    """Every function and method in ``source`` with its length, in source order."""
    found: list[Measured] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                name = prefix + child.name
                found.append(Measured(name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:  # an ``if``, ``try`` or ``with`` holding definitions
                visit(child, prefix)

    visit(ast.parse(source), f"{module}.")
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _lodger_functions() -> tuple[tuple[Path, Measured], ...]:
    return tuple(
        (path, measured)
        for path in sorted(SRC.rglob("*.py"))
        for measured in measure(path.read_text(encoding="utf-8"), _module_name(path))
    )


def test_no_function_is_longer_than_the_limit_unless_allowed() -> None:
    too_long = [
        f"{path.relative_to(SRC.parent)}:{m.line} {m.qualname} is {m.length} lines"
        for path, m in _lodger_functions()
        if m.length > LIMIT and m.qualname not in STATE_MACHINES
    ]
    assert not too_long, (
        f"functions over {LIMIT} lines (extract well-named helpers, or, if one reads as a "
        "single state machine, add it to STATE_MACHINES with the reason):\n" + "\n".join(too_long)
    )


def test_every_allowed_function_exists_and_is_still_long() -> None:
    lengths: dict[str, int] = {}
    for _, m in _lodger_functions():
        lengths[m.qualname] = max(m.length, lengths.get(m.qualname, 0))
    stale = [
        f"{name} ({'gone' if name not in lengths else f'{lengths[name]} lines'})"
        for name in STATE_MACHINES
        if lengths.get(name, 0) <= LIMIT
    ]
    assert not stale, "remove from STATE_MACHINES, now within the limit:\n" + "\n".join(stale)


def test_every_reason_is_one_line() -> None:
    assert all(reason.strip() and "\n" not in reason for reason in STATE_MACHINES.values())


def test_measure_counts_from_def_to_last_line_and_finds_an_over_long_function() -> None:
    long_body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    source = textwrap.dedent(
        '''\
        import functools


        @functools.cache
        @functools.wraps(print)
        def short(a: int) -> int:
            """Three lines, its decorators not counted."""
            return a


        class Box:
            @property
            def size(self) -> int:
                def inner() -> int:
                    return 1

                return inner()

            async def later(self) -> None:
                pass


        if True:
            def conditional() -> None:
                pass
        '''
    )
    source += f"\n\ndef too_long() -> None:\n{long_body}\n"
    measured = {m.qualname: m for m in measure(source, "pkg.mod")}

    assert {name: m.length for name, m in measured.items()} == {
        "pkg.mod.short": 3,
        "pkg.mod.Box.size": 5,
        "pkg.mod.Box.size.<locals>.inner": 2,
        "pkg.mod.Box.later": 2,
        "pkg.mod.conditional": 2,
        "pkg.mod.too_long": LIMIT + 1,
    }
    assert measured["pkg.mod.short"].line == 6  # the ``def``, not the first decorator
    assert [m.qualname for m in measure(source, "pkg.mod") if m.length > LIMIT] == [
        "pkg.mod.too_long"
    ]
