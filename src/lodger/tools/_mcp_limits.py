"""What lodger takes from one MCP server, and what it counts instead of printing.

A server is not trusted to be quiet or small. Its transports (``_mcp_stdio``,
``_mcp_http``) read at most ``max_message_bytes`` of one message before deciding what it
is; a longer message is never parsed, and a request it answered gets an error saying so
(``too_large``). What a server sends that is not protocol (a line on stdout that is not
JSON-RPC, a message over the limit, whatever makes the MCP SDK log a warning) is counted
in the server's ``Noise``, and ``McpServers`` reports it as one line per server when its
block ends, instead of a line (or a traceback) per message.

The SDK logs through the standard ``logging`` module (its loggers ``mcp.*`` and
``client``), from tasks that belong to a server's connection. While any ``McpServers``
block is open, ``capture_sdk_logs`` routes the SDK's warnings logged in a connection's
context (``counting``) into that server's ``Noise``; any other record goes on as it
would have.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MESSAGE_TOO_LARGE",
    "Noise",
    "capture_sdk_logs",
    "counting",
    "too_large",
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The default of ``McpServerConfig.max_message_bytes``: the largest message of a server
lodger reads (a real server's largest listing or result is well under a megabyte)."""

#: the JSON-RPC error code of an answer lodger did not read, in the implementation-defined
#: band (-32000..-32099) and outside the SDK's own (-32000..-32019)
MESSAGE_TOO_LARGE = -32050

_SAMPLE = 80  # characters of a sample of a server's output shown in its noise line


def too_large(server: str, size: int | None, limit: int) -> str:
    """Why a message of ``server`` was not read: it has ``size`` bytes (None: at least
    more than ``limit``)."""
    amount = f"has {size} bytes, more than" if size is not None else "is larger than"
    return (
        f"the server's answer {amount} its max_message_bytes ({limit}); lodger did not read "
        f"it (raise max_message_bytes in [mcp.servers.{server}] if the server is expected "
        "to send that much)"
    )


@dataclass
class Noise:
    """What one server sent that was not protocol, counted across its reconnects."""

    not_json: int = 0
    first_not_json: str = ""
    oversized: int = 0
    largest: int = 0
    sdk_warnings: int = 0
    first_sdk_warning: str = ""
    compressed: int = 0  # HTTP answers compressed though lodger asked for none

    def line(self, text: str) -> None:
        """A line on stdout that is not a JSON-RPC message."""
        if not self.not_json:
            self.first_not_json = text[:_SAMPLE]
        self.not_json += 1

    def message(self, size: int) -> None:
        """A message over the limit (``size`` bytes, as far as lodger counted)."""
        self.oversized += 1
        self.largest = max(self.largest, size)

    def warning(self, text: str) -> None:
        """A warning the SDK logged for this server."""
        if not self.sdk_warnings:
            self.first_sdk_warning = text.strip().split("\n", 1)[0][:_SAMPLE]
        self.sdk_warnings += 1

    def describe(self, server: str, limit: int) -> str | None:
        """One line saying all of it, or None when the server sent no noise."""
        parts = []
        if self.not_json:
            parts.append(
                f"{self.not_json} lines on its stdout were not JSON-RPC and were ignored "
                f"(the first: {self.first_not_json!r})"
            )
        if self.oversized:
            parts.append(
                f"{self.oversized} messages were larger than its max_message_bytes ({limit}; "
                f"the largest at least {self.largest} bytes) and were not read"
            )
        if self.compressed:
            parts.append(
                f"{self.compressed} answers were compressed though lodger asked for none, "
                "and were not read"
            )
        if self.sdk_warnings:
            parts.append(
                f"the MCP SDK warned {self.sdk_warnings} times about it "
                f"(the first: {self.first_sdk_warning!r})"
            )
        return f"MCP server {server!r}: " + "; ".join(parts) if parts else None


_NOISE: contextvars.ContextVar[Noise | None] = contextvars.ContextVar("mcp_noise", default=None)


@contextlib.contextmanager
def counting(noise: Noise) -> Iterator[None]:
    """Count the SDK's warnings logged in this context (and the tasks it starts) in ``noise``."""
    token = _NOISE.set(noise)
    try:
        yield
    finally:
        _NOISE.reset(token)


class _Counted(logging.Handler):
    """On the SDK's ``mcp`` logger: a connection's warnings are counted, the rest go on."""

    def __init__(self, propagate: bool) -> None:
        super().__init__(logging.DEBUG)
        self.propagate = propagate  # what the logger did before lodger took it

    def emit(self, record: logging.LogRecord) -> None:
        noise = _NOISE.get()
        if noise is not None and record.levelno >= logging.WARNING:
            try:
                noise.warning(record.getMessage())
            except Exception:  # noqa: BLE001 - a record whose arguments do not format
                noise.warning(str(record.msg))
            return
        if self.propagate:
            logging.getLogger().handle(record)  # as if it had propagated to the root


#: where the SDK logs: its modules' own names, and its client session's "client"
_SDK_LOGGERS = ("mcp", "client")

_lock = threading.Lock()
_users = 0
_installed: list[tuple[logging.Logger, _Counted]] = []


@contextlib.contextmanager
def capture_sdk_logs() -> Iterator[None]:
    """Route the SDK's logging through ``_Counted`` while the block runs (nests, and any
    number of blocks may be open at once)."""
    global _users
    with _lock:
        if _users == 0:
            for name in _SDK_LOGGERS:
                logger = logging.getLogger(name)
                handler = _Counted(logger.propagate)
                logger.addHandler(handler)
                logger.propagate = False
                _installed.append((logger, handler))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for logger, handler in _installed:
                    logger.removeHandler(handler)
                    logger.propagate = handler.propagate
                _installed.clear()
