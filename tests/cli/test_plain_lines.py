"""The live view's lines on a pipe: written as plain text, byte for byte what rich writes.

``lodger run`` piped into a file or a program prints a line or two per call. Rich spends
about 0.2 ms on each (segments, styles, a width check); ``Terminal`` writes the plain text
itself when that is what rich would write, and hands everything else to rich."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from lodger.cli._live import Terminal

LINES = [
    "",
    "  -> noop ",
    "x" * 500,
    "  <- noop ok  trailing   ",
    "wide 漢字 ✓ é",
    "tab\there",  # rich expands tabs: this one goes to rich
    "two\nlines",
    "[bold]not markup[/]",
    ":smile: no emoji",
    "https://example.com/x 123 0x1f",
    "\\x1b shown escaped",
]


def console(file: io.StringIO, *, soft_wrap: bool = True, record: bool = False) -> Console:
    made = Console(file=file, highlight=False, emoji=False, record=record)
    made.width = 200
    made.soft_wrap = soft_wrap
    return made


def through_rich(line: Text, end: str, **options: bool) -> str:
    out = io.StringIO()
    console(out, **options).print(line, end=end)
    return out.getvalue()


@pytest.mark.parametrize("end", ["\n", ""])
@pytest.mark.parametrize("text", LINES)
def test_a_piped_line_is_what_rich_writes(text: str, end: str) -> None:
    line = Text("  -> ", style="yellow") + Text(text, style="bold")
    out = io.StringIO()
    Terminal(console(out)).print(line, end=end)
    assert out.getvalue() == through_rich(line, end)


def test_only_a_plain_piped_console_skips_rich() -> None:
    line = Text("x" * 300)  # longer than the width: rich cuts it without soft wrap
    wrapped = io.StringIO()
    Terminal(console(wrapped, soft_wrap=False)).print(line)
    assert wrapped.getvalue() == through_rich(line, "\n", soft_wrap=False)
    assert wrapped.getvalue() != line.plain + "\n"

    out = io.StringIO()
    recorded = console(out, record=True)
    Terminal(recorded).print(line)
    assert recorded.export_text() == line.plain + "\n"  # rich saw it: it records it

    colored = io.StringIO()
    Terminal(Console(file=colored, force_terminal=True, color_system="standard")).print(
        Text("ok", style="green")
    )
    assert "\x1b[" in colored.getvalue()
