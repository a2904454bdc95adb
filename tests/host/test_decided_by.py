"""Decisions over the host say who decided: the answering token's public id (never the
token itself), on the approval and on the ``permission_decided`` fact; an operator's
decision and abandon over the host name the token too."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger.client import StreamedFact
from lodger.storage.control.host_index import hash_token, token_id

from ._support import running_host, write_script

SCRIPT = [{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "over"}]


async def test_an_approval_over_the_host_records_the_tokens_public_id(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", SCRIPT)
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as admin:
        sid = await admin.create_session()
        token = await admin.make_token(session_id=sid, label="reviewer")
        public = token_id(hash_token(token))
        async with host.client(token) as reviewer:
            sent = await admin.send(sid, "ship it", key="1")
            seen: list[StreamedFact] = []

            async def asked() -> StreamedFact:
                async for fact in reviewer.stream(sid):
                    seen.append(fact)
                    if fact.kind == "permission_requested":
                        return fact
                raise AssertionError("stream ended")

            call_id = (await asyncio.wait_for(asked(), 30)).data["call_id"]
            decided = await reviewer.answer(sid, call_id, allow=True)
            assert decided["answered_by"] == f"token:{public}"
            await admin.wait_message(sid, sent["message"]["id"])
        facts = await admin.events(sid)
        (decision,) = [f.data["body"] for f in facts if f.kind == "permission_decided"]
        assert (decision["decision"], decision["by"], decision["who"]) == (
            "allow",
            "user",
            f"token:{public}",
        )
        stored = b"".join(p.read_bytes() for p in host.state.rglob("*") if p.is_file())
        assert public.encode() in stored
        assert token.encode() not in stored  # the secret is in no file of the host
