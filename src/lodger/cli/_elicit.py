"""The terminal's answers to an MCP server's questions (``lodger run`` asks).

A form question asks for each field of the server's schema in turn (its title and
description shown, its default taken on an empty line, an enum's choices listed; a
field the schema marks sensitive is read without echo), then checks the whole answer
against the schema and asks again, up to three times, before it declines. A URL question
shows the URL to the person (only here: the model never reads it) and asks whether they
completed what it asks for. EOF, or a stopped turn, cancels.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rich.text import Text

from lodger.cli._identity import cli_user
from lodger.cli._live import Terminal, _reader
from lodger.tools._mcp_requests import form_problems, sensitive_fields
from lodger.tools.spec import Elicitation, ElicitationReply, Elicitor

__all__ = ["ask_elicitation", "terminal_elicitor"]

_TRIES = 3


def terminal_elicitor(terminal: Terminal) -> Elicitor:
    """The CLI's ``Elicitor``: asks at the terminal, one question at a time."""

    async def elicit(question: Elicitation) -> ElicitationReply:
        cancelled = threading.Event()
        try:
            return await asyncio.to_thread(
                ask_elicitation, terminal, question, _reader(terminal.console, cancelled)
            )
        finally:
            cancelled.set()  # a stopped turn: the reading thread ends within 0.1 s

    return elicit


def ask_elicitation(
    terminal: Terminal, question: Elicitation, read: Callable[[str], str]
) -> ElicitationReply:
    """Ask one question at the terminal (on a worker thread: reading blocks)."""
    terminal.hold()
    try:
        console = terminal.console
        console.print(Text(f"  ?  MCP server {question.server} asks:", style="bold magenta"))
        console.print(Text(f"     {question.message}"), soft_wrap=True)
        try:
            if question.mode == "url":
                console.print(Text(f"     open: {question.url}", style="bold"), soft_wrap=True)
                answer = read("     [y] done  [n] decline  [c] cancel (default c): ").strip()
                action = {"y": "accept", "yes": "accept", "n": "decline", "no": "decline"}
                return ElicitationReply(action=action.get(answer.lower(), "cancel"), who=cli_user())  # type: ignore[arg-type]
            answer = read("     [y] answer  [n] decline  [c] cancel (default y): ").strip().lower()
            if answer in ("n", "no", "decline"):
                return ElicitationReply(action="decline", who=cli_user())
            if answer in ("c", "cancel"):
                return ElicitationReply(action="cancel", who=cli_user())
            return _form(terminal, question.requested_schema, read)
        except EOFError:
            console.print()
            return ElicitationReply(action="cancel", who=cli_user())
    finally:
        terminal.release()


def _form(
    terminal: Terminal, schema: Mapping[str, Any], read: Callable[[str], str]
) -> ElicitationReply:
    console = terminal.console
    properties = schema.get("properties")
    fields: dict[str, Any] = properties if isinstance(properties, dict) else {}
    required = set(schema.get("required") or ())
    secret = sensitive_fields(schema)
    for _ in range(_TRIES):
        content: dict[str, Any] = {}
        for name, spec in fields.items():
            value = _field(name, spec if isinstance(spec, dict) else {}, read, name in secret)
            if value is None and name not in required:
                continue
            content[name] = value
        problems = form_problems(schema, content)
        if not problems:
            return ElicitationReply(action="accept", content=content, who=cli_user())
        for problem in problems:
            console.print(Text(f"     {problem}", style="yellow"))
    console.print(Text("     the answer does not match the form: declined", style="yellow"))
    return ElicitationReply(action="decline", who=cli_user())


def _field(name: str, spec: Mapping[str, Any], read: Callable[[str], str], secret: bool) -> Any:
    title = spec.get("title") or name
    kind = spec.get("type", "string")
    hint = ""
    choices = spec.get("enum")
    items = spec.get("items")
    if kind == "array" and isinstance(items, dict):
        choices = items.get("enum")
        hint = " (comma-separated)"
    if isinstance(choices, list):
        hint = f" [{', '.join(map(str, choices))}]{hint}"
    elif kind == "boolean":
        hint = " [y/n]"
    if "default" in spec:
        hint += f" (default {spec['default']})"
    about = f" - {spec['description']}" if spec.get("description") else ""
    with _no_echo(secret):
        raw = read(f"     {title}{about}{hint}: ").strip()
    if secret:
        print(file=sys.stderr)
    if not raw:
        return spec.get("default")
    return _typed(raw, kind)


def _typed(raw: str, kind: object) -> Any:
    """The answer line as the field's type (a wrong one stays text: the check says why)."""
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
    except ValueError:
        return raw
    if kind == "boolean":
        return raw.lower() in ("y", "yes", "true", "1")
    if kind == "array":
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw


@contextlib.contextmanager
def _no_echo(secret: bool) -> Iterator[None]:
    """The terminal without echo while a sensitive field is typed."""
    if not secret or not sys.stdin.isatty():
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    new = list(old)
    new[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSADRAIN, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)
