"""Warnings from below the command line as one line each on stderr, JSON under ``--json``.

The tool layer logs what an operator should know and a run survives: an MCP server's
noise (``lodger.tools._mcp_limits``), a cut listing, tools that cannot be called; so does
psycopg's pool (``psycopg.pool``), once per failed connection of the control plane's. Without
a handler, Python's last-resort one prints them as text (a traceback too, when one is
attached), also under ``--json``. While a command runs, ``warnings_on_stderr`` takes the
``lodger.tools`` and ``psycopg.pool`` loggers: each warning is ``warning: <text>`` on one
line of at most ``MAX_CHARS`` characters, or ``{"v": 1, "notice": "<text>", "level":
"warning"}`` under ``--json``; a traceback only with ``--debug``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import click

from lodger.cli._common import document

__all__ = ["MAX_CHARS", "warnings_on_stderr"]

MAX_CHARS = 2000


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines()] or [""]
    line = " ".join(line for line in lines if line)
    if len(line) <= MAX_CHARS:
        return line
    return f"{line[:MAX_CHARS]}... ({len(line) - MAX_CHARS} more characters cut)"


class _Lines(logging.Handler):
    def __init__(self, *, as_json: bool, debug: bool) -> None:
        super().__init__(logging.WARNING)
        self.as_json = as_json
        self.debug = debug

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = _one_line(record.getMessage())
        except Exception:  # noqa: BLE001 - a record whose arguments do not format
            text = _one_line(str(record.msg))
        if self.as_json:
            line = json.dumps(
                document({"notice": text, "level": record.levelname.lower()}),
                ensure_ascii=False,
            )
        else:
            line = f"{record.levelname.lower()}: {text}"
        click.echo(line, err=True)
        if self.debug and record.exc_info is not None:
            click.echo(logging.Formatter().formatException(record.exc_info), err=True)


@contextlib.contextmanager
def warnings_on_stderr(*, as_json: bool, debug: bool) -> Iterator[None]:
    """Print the tool layer's warnings while the block runs (see the module docstring)."""
    handler = _Lines(as_json=as_json, debug=debug)
    # psycopg's pool logs each failed connection attempt of the control plane's pool
    loggers = [logging.getLogger(name) for name in ("lodger.tools", "psycopg.pool")]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, before in zip(loggers, propagate, strict=True):
            logger.removeHandler(handler)
            logger.propagate = before
