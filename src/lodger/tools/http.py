"""Idempotency keys minted by T1, and a small HTTP helper that sends them.

Every dispatched call carries ``ToolContext.idempotency_key``: derived from the session
and the call's *first* operation id, so a re-dispatch of an idempotent call (a T1 with
``retry_of``, after a crash) carries the same key as the attempt it re-runs. A remote
API that honours ``Idempotency-Key`` then answers the re-sent request with the result it
stored the first time: the effect happens once, however often lodger crashes around it.

``http_request`` is the helper tools use to talk to such an API: it sends the key as
``Idempotency-Key`` (unless the caller set one) and runs the blocking request on a worker
thread (the standard library's ``urllib``: no extra to install).

>>> idempotency_key("s1", "op-1") == idempotency_key("s1", "op-1")
True
"""

from __future__ import annotations

import json as jsonlib
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lodger.errors import ToolCallError
from lodger.tools.spec import ToolContext, idempotency_key, run_in_worker

__all__ = ["HttpResponse", "http_request", "idempotency_key"]

#: the header a remote API reads the key from (the IETF draft's and Stripe's name)
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True, kw_only=True)
class HttpResponse:
    """What the server answered: status, headers (lower-cased names) and body bytes."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.body)


async def http_request(
    ctx: ToolContext,
    method: str,
    url: str,
    *,
    json: Any = None,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - urllib's socket timeout, on its thread
) -> HttpResponse:
    """Send one request for the call ``ctx`` with its ``Idempotency-Key``.

    A status of 400 and above is returned, not raised (the tool decides what it means);
    an unreachable server raises ``ToolCallError`` (the model sees the error)."""
    if not url.startswith(("http://", "https://")):
        raise ToolCallError(
            f"http_request takes an http:// or https:// URL, not {url[:80]!r}",
            code="bad_url",
        )
    sent = {k: v for k, v in (headers or {}).items()}
    if ctx.idempotency_key and not any(k.lower() == "idempotency-key" for k in sent):
        sent[IDEMPOTENCY_HEADER] = ctx.idempotency_key
    data = body
    if json is not None:
        data = jsonlib.dumps(json).encode()
        sent.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, headers=sent, method=method.upper())

    def send() -> HttpResponse:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return HttpResponse(
                    status=response.status,
                    body=response.read(),
                    headers={k.lower(): v for k, v in response.headers.items()},
                )
        except urllib.error.HTTPError as exc:
            return HttpResponse(
                status=exc.code,
                body=exc.read(),
                headers={k.lower(): v for k, v in exc.headers.items()},
            )
        except (urllib.error.URLError, OSError) as exc:
            raise ToolCallError(
                f"{method.upper()} {url} failed: {exc}", code="http_unreachable"
            ) from None

    result: HttpResponse = await run_in_worker(send)
    return result
