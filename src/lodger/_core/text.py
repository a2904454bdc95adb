r"""Text the log can hold: valid UTF-8, never a lone surrogate.

Python decodes a file name that is not UTF-8 (``b'caf\xe9.txt'``) with ``surrogateescape``
into ``'caf\udce9.txt'``; a provider may decode a lone surrogate from a JSON ``\udXXX``
escape. UTF-8 has no encoding for either, so an event holding one cannot be stored
(``events.seal`` refuses it). Whatever shows such text to the model or records it writes
it with ``visible_text`` first: ``caf\xe9.txt``, a name a person can read and tell apart.
"""

from __future__ import annotations

import re

__all__ = ["escape_matches", "is_valid_utf8", "visible_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    # surrogateescape keeps an undecodable byte 0xNN as U+DCNN: show the byte it stands for.
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def _code(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_matches(pattern: re.Pattern[str], text: str) -> str:
    r"""``text`` with each character ``pattern`` matches written out as its escape
    (``\x1b``, ``\u202e``): how control characters from a command, a model or a log are
    shown without acting on the terminal that shows them.

    >>> escape_matches(re.compile("[\x1b]"), "\x1b[2J")
    '\\x1b[2J'
    """
    return pattern.sub(_code, text)


def is_valid_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def visible_text(text: str) -> str:
    r"""``text`` with every lone surrogate written out as escape text, so it is valid UTF-8.

    >>> visible_text("caf\udce9.txt")
    'caf\\xe9.txt'
    """
    if is_valid_utf8(text):
        return text
    return _SURROGATE.sub(_escape, text)
