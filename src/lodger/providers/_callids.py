"""Call ids as another provider takes them.

A session's call ids are the ones its models gave (or lodger's own, for a server that
reused or left one out), and a session may move between providers: OpenAI chat takes ids
of at most 40 characters, Anthropic only ``[A-Za-z0-9_-]``. An id a provider would refuse
is sent as a stable digest of itself, the same in every request, so a call and its result
still pair; an id the provider takes (every one it made itself) is sent as it is.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["wire_call_id"]

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


def wire_call_id(call_id: str, *, max_len: int, plain: bool, prefix: str) -> str:
    """``call_id`` as a provider whose ids hold at most ``max_len`` characters (and only
    ``[A-Za-z0-9_-]`` when ``plain``) takes it.

    >>> wire_call_id("call_1", max_len=40, plain=True, prefix="toolu_")
    'call_1'
    >>> wire_call_id("functions.lookup:0", max_len=64, plain=True, prefix="toolu_")[:6]
    'toolu_'
    """
    if 0 < len(call_id) <= max_len and (not plain or _PLAIN.fullmatch(call_id)):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return prefix + digest[: max_len - len(prefix)]
