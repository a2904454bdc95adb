"""The timeline page in a real headless Chromium (Debian's ``chromium``, driven by
Playwright with the system executable): it loads a session, shows a call arriving live,
and a decide button resolves a parked call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from ._support import running_host, write_script

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.mark.slow
async def test_the_timeline_shows_calls_live_and_decides_a_parked_call(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        {
            "turns": [
                [{"calls": [{"name": "echo", "args": {"text": "first"}}]}, {"text": "one done"}],
                [
                    {
                        "calls": [
                            {"name": "gate", "args": {"name": "live"}},
                            {"name": "echo", "args": {"text": "<b>not markup</b>"}},
                        ]
                    },
                    {"calls": [{"name": "deploy", "args": {"target": "prod"}}]},
                    {"text": "shipped"},
                ],
            ]
        },
    )
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as c,
        async_playwright() as pw,
    ):
        sid = await c.create_session()
        first = await c.send(sid, "warm up", key="1")
        await c.wait_message(sid, first["message"]["id"])
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{host.url}/timeline/{sid}#token={host.token}")
            # loads the session: the first turn's call with its T1 -> T2 times
            done = page.locator('.call[data-status="ok"]')
            await done.first.wait_for(timeout=20_000)
            assert "T2" in await done.first.inner_text()
            assert host.token not in page.url  # the token left the address bar
            # a call arriving live: the gate call shows as running while it runs
            second = await c.send(sid, "ship it", key="2")
            running = page.locator('.call[data-status="running"]')
            await running.first.wait_for(timeout=20_000)
            assert "gate" in await running.first.inner_text()
            assert await page.locator("b").count() == 0  # facts are text, never markup
            (gates / "live").touch()
            # the parked call gets decide buttons; clicking allow continues the run
            allow = page.locator('.call[data-status="parked"] button[data-decide="allow"]')
            await allow.wait_for(timeout=20_000)
            await allow.click()
            await page.locator(".end", has_text="shipped").wait_for(timeout=20_000)
            result = await c.wait_message(sid, second["message"]["id"])
            assert result["result"]["answer"] == "shipped"
            facts = await c.events(sid)
            decided = [f.data["body"] for f in facts if f.kind == "permission_decided"]
            assert [(d["decision"], d["by"]) for d in decided] == [("allow", "user")]
            # the two calls of one step overlap in time: both bars share the step's axis
            bars = page.locator('.step:has(.call[data-status="ok"]) .bar')
            assert await bars.count() >= 2
            shown = int(await page.locator("body").get_attribute("data-last-offset") or -1)
            assert shown == facts[-1].offset
        finally:
            await browser.close()
            await asyncio.sleep(0)


@pytest.mark.slow
async def test_the_timeline_shows_a_compaction_and_a_failed_one(tmp_path: Path) -> None:
    sections = ("Goal", "Progress", "Decisions", "Files touched", "Open questions", "Next step")
    summary = "\n".join(f"## {s}\n- <b>said hi</b>" for s in sections)
    good = write_script(tmp_path / "good.json", [{"text": summary}])
    async with (
        running_host(tmp_path / "state", models=(good, "test")) as host,
        host.client() as c,
        async_playwright() as pw,
    ):
        sid = await c.create_session()
        sent = await c.send(sid, "say hi", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{host.url}/timeline/{sid}#token={host.token}")
            await page.locator(".end", has_text="turn completed").wait_for(timeout=20_000)
            made = await c.compact(sid)  # arrives live, between turns
            line = page.locator(".compaction", has_text="compacted [0, ")
            await line.wait_for(timeout=20_000)
            text = await line.inner_text()
            assert f"[0, {made['fact']['body']['covers']['high_water']})" in text
            assert "(manual, " in text and "result(s) summarized" in text
            assert await page.locator(".turn").count() == 1  # no box for a turn that is not
            assert await page.locator("b").count() == 0
            # the test model's summary has none of the sections: the failure shows too
            other = await c.create_session(model="test")
            sent = await c.send(other, "hello", key="2")
            await c.wait_message(other, sent["message"]["id"])
            await page.goto(f"{host.url}/timeline/{other}")  # the cookie from the first load
            failed = await c.compact(other)
            assert failed["compacted"] is False
            line = page.locator(".compaction", has_text="compaction failed (manual): ")
            await line.wait_for(timeout=20_000)
            assert "fallback elision" in await line.inner_text()
        finally:
            await browser.close()
            await asyncio.sleep(0)


@pytest.mark.slow
async def test_the_timeline_shows_a_cancel_and_a_mode_switch(tmp_path: Path, gates: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "gate", "args": {"name": "never"}}]}, {"text": "not reached"}],
    )
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as c,
        async_playwright() as pw,
    ):
        sid = await c.create_session()
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{host.url}/timeline/{sid}#token={host.token}")
            sent = await c.send(sid, "wait", key="1")
            await page.locator('.call[data-status="running"]').first.wait_for(timeout=20_000)
            assert (await c.cancel(sid, reason="<i>enough</i>"))["status"] == "cancelled"
            shown = page.locator(".control", has_text="cancel requested by token:")
            await shown.wait_for(timeout=20_000)
            assert "<i>enough</i>" in await shown.inner_text()  # text, never markup
            assert await page.locator("i").count() == 0
            await page.locator(".end", has_text="turn cancelled").wait_for(timeout=20_000)
            await page.locator('.call[data-status="cancelled"]').wait_for(timeout=20_000)
            await c.wait_message(sid, sent["message"]["id"])
            assert (await c.set_permission_mode(sid, "plan"))["status"] == "changed"
            await page.locator(".control", has_text="permission mode none → plan").wait_for(
                timeout=20_000
            )
        finally:
            await browser.close()
            await asyncio.sleep(0)
