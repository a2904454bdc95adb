"""The protected MCP server of these tests, and a test client in place of a browser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SERVER = Path(__file__).parents[2] / "mcp_servers" / "oauth_server.py"


@dataclass(frozen=True)
class Guarded:
    """The running server: its MCP URL and its test controls."""

    base: str

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def mode(self, **changes: Any) -> None:
        self._post("/_test/mode", changes)

    def expire(self, *, refresh: bool = False) -> None:
        self._post("/_test/expire", {"refresh": refresh})

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/_test/state", timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result


def approve(authorization_url: str) -> str:
    """Follow the authorization URL as a browser would, up to the redirect it answers
    with; that redirect's URL (the callback, not yet visited)."""
    request = urllib.request.Request(authorization_url, method="GET")
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        opener.open(request, timeout=10)
    except urllib.error.HTTPError as answer:
        if answer.code in (302, 303, 307):
            return str(answer.headers["Location"])
        raise
    raise AssertionError("the authorization endpoint did not redirect")


def callback_query(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
