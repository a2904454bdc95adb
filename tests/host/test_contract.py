"""The host answers what its document (``docs/openapi.json``) declares, case by case: the
mismatches schemathesis found (``test_fuzz`` looks for more), each checked on a real host
against the committed document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import jsonschema

from lodger.host.routes.events import MAX_OFFSET

from ._support import running_host, write_script

DOC: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "docs" / "openapi.json").read_text(encoding="utf-8")
)


def _declared(method: str, path: str, status: int) -> bool:
    return str(status) in DOC["paths"][path][method.lower()]["responses"]


def _valid(schema_name: str, body: dict[str, Any]) -> bool:
    """Whether ``body`` is valid against the document's ``schema_name``."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": DOC["components"]}
    return not list(jsonschema.Draft202012Validator(schema).iter_errors(body))


async def test_an_undeclared_method_is_405_with_every_method_of_the_path(tmp_path: Path) -> None:
    async with running_host(tmp_path / "state") as host:
        auth = {"Authorization": f"Bearer {host.token}"}
        async with httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=30) as raw:
            for method, path in (
                ("TRACE", "/v1/tokens"),
                ("DELETE", "/v1/sessions"),
                ("PUT", "/v1/tokens/revoke"),
            ):
                answer = await raw.request(method, path)
                assert answer.status_code == 405, (method, path, answer.text)
                allowed = {m.strip() for m in answer.headers["allow"].split(",")}
                documented = {m.upper() for m in DOC["paths"][path]}
                assert documented <= allowed <= documented | {"HEAD"}, (path, allowed)
                assert answer.json()["error"]["code"] == "invalid_request"


async def test_a_model_is_named_or_left_out_and_an_unoffered_one_is_not_found(
    tmp_path: Path,
) -> None:
    async with running_host(tmp_path / "state") as host:
        auth = {"Authorization": f"Bearer {host.token}"}
        async with httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=30) as raw:
            assert not _valid("CreateSession", {"model": ""})
            empty = await raw.post("/v1/sessions", json={"model": ""})
            assert empty.status_code == 422, empty.text
            assert empty.json()["error"]["code"] == "invalid_request"
            assert _valid("CreateSession", {"model": "openai:gpt-4.1"})
            other = await raw.post("/v1/sessions", json={"model": "openai:gpt-4.1"})
            assert other.status_code == 404 and _declared("POST", "/v1/sessions", 404)
            assert other.json()["error"]["code"] == "model_not_allowed"
            assert "use one of: test" in other.json()["error"]["hint"]
            assert (await raw.post("/v1/sessions", json={"model": "test"})).status_code == 201


async def test_a_revoke_names_exactly_one_of_token_and_id_as_its_document_says(
    tmp_path: Path,
) -> None:
    async with running_host(tmp_path / "state") as host:
        auth = {"Authorization": f"Bearer {host.token}"}
        tid = "tok_0123456789abcdef"
        async with httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=30) as raw:
            for body in (
                {},
                {"token": "lgr_x", "id": tid},
                {"token": None},
                {"token": None, "id": tid},
            ):
                assert not _valid("RevokeToken", body), body
                refused = await raw.post("/v1/tokens/revoke", json=body)
                assert refused.status_code == 422, (body, refused.text)
                assert "exactly one of token and id" in refused.json()["error"]["message"]
            for body in ({"token": "lgr_unknown"}, {"id": tid}):
                assert _valid("RevokeToken", body), body
                unknown = await raw.post("/v1/tokens/revoke", json=body)
                assert unknown.status_code == 200 and unknown.json() == {"revoked": False}
        assert await host.control.grant(host.token) is not None  # none of those revoked it


async def test_a_fork_shares_at_least_one_event_and_past_the_head_is_a_conflict(
    tmp_path: Path,
) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        held = len(await c.events(sid))
        path = "/v1/sessions/{session_id}/fork"
        auth = {"Authorization": f"Bearer {host.token}"}
        async with httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=30) as raw:
            url = f"/v1/sessions/{sid}/fork"
            assert not _valid("ForkSession", {"at": 0})
            empty = await raw.post(url, json={"at": 0})
            assert empty.status_code == 422, empty.text
            assert empty.json()["error"]["code"] == "invalid_request"
            for at in (held + 1, MAX_OFFSET):
                assert _valid("ForkSession", {"at": at})
                beyond = await raw.post(url, json={"at": at})
                assert beyond.status_code == 409 and _declared("POST", path, 409), beyond.text
                assert beyond.json()["error"]["code"] == "fork_beyond_head"
                assert beyond.json()["error"]["offset"] == at
            assert not _valid("ForkSession", {"at": MAX_OFFSET + 1})
            assert (await raw.post(url, json={"at": MAX_OFFSET + 1})).status_code == 422
            first = await raw.post(url, json={"at": 1})
            assert first.status_code == 201, first.text
            assert first.json()["high_water"] == 1
        assert len(await c.events(first.json()["session_id"])) == 1  # its own session_started


async def test_a_body_over_the_limit_is_a_declared_413_on_every_route(tmp_path: Path) -> None:
    for path, methods in DOC["paths"].items():
        for method in methods:
            assert _declared(method, path, 413), (method, path)
    async with running_host(tmp_path / "state") as host:
        auth = {"Authorization": f"Bearer {host.token}"}
        async with httpx2.AsyncClient(base_url=host.url, headers=auth, timeout=30) as raw:
            big = await raw.post("/v1/sessions", content=b"x" * (1024 * 1024 + 1))
            assert big.status_code == 413
            assert _valid("ErrorBody", big.json())
            assert big.json()["error"]["code"] == "payload_too_large"
