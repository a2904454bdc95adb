"""Webhooks: a signed delivery becomes a message; a bad signature is refused; a replayed
delivery wakes nothing; per-event hooks make one session per delivery."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from lodger.errors import ConfigError
from lodger.host import HookConfig
from lodger.host.webhooks import load_hooks, sign

from ._support import running_host, write_script

SECRET = b"it's a secret to everybody"


async def _deliver(
    url: str, name: str, body: bytes, delivery: str, secret: bytes = SECRET
) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=url) as raw:
        return await raw.post(
            f"/hooks/{name}",
            content=body,
            headers={
                "X-Hub-Signature-256": sign(secret, body),
                "X-GitHub-Delivery": delivery,
                "X-GitHub-Event": "issues",
                "Content-Type": "application/json",
            },
        )


@pytest.mark.slow
async def test_a_signed_delivery_runs_once_and_a_replay_wakes_nothing(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "triaged"}])
    hooks = {
        "github": HookConfig(name="github", secret=SECRET, session="triage"),
        "each": HookConfig(name="each", secret=SECRET, session=None),
    }
    async with (
        running_host(tmp_path / "state", models=(model,), hooks=hooks) as host,
        host.client() as c,
    ):
        body = json.dumps({"action": "opened", "issue": {"number": 7}}).encode()
        first = await _deliver(host.url, "github", body, "d-1")
        assert first.status_code == 202, first.text
        accepted = first.json()
        assert accepted["session_id"] == "triage" and accepted["created"]
        replay = await _deliver(host.url, "github", body, "d-1")
        assert replay.status_code == 202 and not replay.json()["created"]
        assert replay.json()["message"]["id"] == accepted["message"]["id"]
        await c.wait_message("triage", accepted["message"]["id"])
        facts = await c.events("triage")
        inputs = [f.data["body"]["input"] for f in facts if f.kind == "turn_started"]
        assert len(inputs) == 1 and '"number": 7' in inputs[0] and "issues" in inputs[0]
        assert SECRET.decode() not in json.dumps([f.data for f in facts])

        # refused: wrong secret, tampered body, no signature, unknown hook, no delivery id
        bad = await _deliver(host.url, "github", body, "d-2", secret=b"wrong secret!!")
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "bad_signature"
        async with httpx2.AsyncClient(base_url=host.url) as raw:
            tampered = await raw.post(
                "/hooks/github",
                content=body + b" ",
                headers={"X-Hub-Signature-256": sign(SECRET, body), "X-GitHub-Delivery": "d-3"},
            )
            assert tampered.status_code == 401
            unsigned = await raw.post(
                "/hooks/github", content=body, headers={"X-GitHub-Delivery": "d-4"}
            )
            assert unsigned.status_code == 401
            no_id = await raw.post(
                "/hooks/github", content=body, headers={"X-Hub-Signature-256": sign(SECRET, body)}
            )
            assert no_id.status_code == 400 and no_id.json()["error"]["code"] == "invalid_request"
        unknown = await _deliver(host.url, "nope", body, "d-5")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_hook"
        assert len([f for f in await c.events("triage") if f.kind == "turn_started"]) == 1

        # a hook with a session per event: a replay goes to the same session, runs nothing
        one = (await _deliver(host.url, "each", b'{"n": 1}', "e-1")).json()
        two = (await _deliver(host.url, "each", b'{"n": 2}', "e-2")).json()
        again = (await _deliver(host.url, "each", b'{"n": 1}', "e-1")).json()
        assert one["session_id"] != two["session_id"]
        assert again["session_id"] == one["session_id"] and not again["created"]
        for made in (one, two):
            await c.wait_message(made["session_id"], made["message"]["id"])
            started = [f for f in await c.events(made["session_id"]) if f.kind == "turn_started"]
            assert len(started) == 1


def test_hooks_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "hooks.toml"
    path.write_text('[hooks.gh]\nsecret_env = "GH_SECRET"\nsession = "s1"\n')
    hooks = load_hooks(path, {"GH_SECRET": "0123456789"})
    assert hooks["gh"].session == "s1" and hooks["gh"].secret == b"0123456789"
    assert "0123456789" not in repr(hooks["gh"])
    with pytest.raises(ConfigError, match="not set"):
        load_hooks(path, {})
    path.write_text('[hooks.gh]\nsecret = "0123456789"\nsesion = "typo"\n')
    with pytest.raises(ConfigError, match="sesion"):
        load_hooks(path, {})
    path.write_text('[hooks.gh]\nsecret = "short"\n')
    with pytest.raises(ConfigError, match="at least 8"):
        load_hooks(path, {})
