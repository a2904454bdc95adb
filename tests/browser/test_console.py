"""The operator console in Debian's headless Chromium, against a real ``lodger serve``
subprocess and a real store (a ``--state`` directory; a ``file://`` object store): find a
session by search, read a call's arguments and result (a large one from its artifact),
hostile text kept as text, approve a parked call by clicking, see facts arrive live,
recover a turn whose ``lodger run`` process was SIGKILLed mid-call and fork it. Each test
keeps screenshots (under ``$LODGER_TEST_ARTIFACTS``) and checks the main pages with
axe-core."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from ._console import (
    artifacts_dir,
    axe_violations,
    chromium,
    new_page,
    script,
    serve,
    shot,
    wait_for,
)

pytestmark = pytest.mark.slow

HOSTILE = "<img src=x onerror=\"document.title='pwned'\"> \u202egnp.exe\u202c bell\u0007 end"
BIG = "line of a long result\n" * 1200  # over the 16 000 characters T2 keeps: an artifact


async def test_find_a_session_and_read_its_calls_hostile_text_stays_text(
    tmp_path: Path, gates: Path
) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {
                "calls": [
                    {"name": "echo", "args": {"text": HOSTILE}},
                    {"name": "echo", "args": {"text": BIG}},
                ]
            },
            {"text": "done <b>not bold</b>"},
        ],
    )
    where = artifacts_dir(tmp_path)
    async with (
        serve(["--state", str(tmp_path / "state")], model, gates, tmp_path / "host.out") as host,
        host.client() as c,
        chromium() as browser,
    ):
        others = [await c.create_session(session_id=f"other-{i}") for i in range(3)]
        sid = await c.create_session(session_id="needle-session")
        sent = await c.send(sid, "echo the hostile text", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        # the console's pages carry a strict CSP, and its assets are served with it
        async with httpx2.AsyncClient(base_url=host.url) as raw:
            page_answer = await raw.get("/console")
            csp = page_answer.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert "unsafe-inline" not in csp
            assert (
                (await raw.get("/console/assets/app.js"))
                .headers["content-type"]
                .startswith("text/javascript")
            )
            assert (await raw.get("/console/assets/..%2Fhub.py")).status_code in (404, 422)
            assert (await raw.get("/v1/console/sessions")).status_code == 401

        page = await new_page(browser)
        await page.goto(host.console())
        await page.locator("#sessions tbody tr").nth(3).wait_for()
        assert "token=" not in page.url  # the token left the address bar
        # find it by search (typed as a person types)
        await page.locator("#search").fill("needle")
        await wait_for(lambda: _rows_are(page, ["needle-session"]))
        row = page.locator('tr[data-session-id="needle-session"]')
        assert "completed" in await row.inner_text()
        await shot(page, where, "sessions-light")
        assert not await axe_violations(page)
        await page.keyboard.press("Tab")  # keyboard: the link is reachable and opens it
        await row.get_by_role("link").focus()
        await page.keyboard.press("Enter")
        await page.locator(".turn").first.wait_for()
        echo = page.locator(".call").first
        await echo.locator("button.toggle").wait_for()
        await page.locator('.call[data-status="ok"]').nth(1).wait_for()
        # expand the call: arguments and result, as text
        toggle = echo.locator("button.toggle")
        assert await toggle.get_attribute("aria-expanded") == "false"
        await toggle.click()
        assert await toggle.get_attribute("aria-expanded") == "true"
        args = await echo.locator("pre.arguments").inner_text()
        assert '"text": "<img src=x onerror=' in args
        result = await echo.locator("pre.result-text").inner_text()
        assert "<img src=x onerror=" in result
        # the bidi override and the bell are shown as escapes, never acted on
        assert "\\u202e" in result and "\\u0007" in result and "\u202e" not in result
        assert await page.locator("img").count() == 0 and await page.locator("b").count() == 0
        assert await page.title() != "pwned"
        # the large result: a preview in T2, the whole from the artifact route
        big = page.locator(".call").nth(1)
        await big.locator("button.toggle").click()
        load = big.get_by_role("button", name="Load the full result")
        await load.click()
        await big.locator("pre.artifact").wait_for()  # shown once its bytes arrived
        full = await big.locator("pre.artifact").inner_text()
        assert full.count("line of a long result") == 1200
        # usage and cost of the turn and the session (script models cost nothing)
        assert "$0.000000" in await page.locator("#session-usage").inner_text()
        await shot(page, where, "session-light")
        assert not await axe_violations(page)
        # dark: the same page, readable (axe checks contrast too)
        dark = await new_page(browser, dark=True)
        await dark.goto(host.console(f"/session/{sid}"))  # a new context: sign in again
        await dark.locator('.call[data-status="ok"]').nth(1).wait_for()
        await dark.locator(".call button.toggle").first.click()
        await shot(dark, where, "session-dark")
        assert not await axe_violations(dark)
        await dark.goto(f"{host.url}/console#/sessions")
        await dark.locator("#sessions tbody tr").nth(3).wait_for()
        assert not await axe_violations(dark)
        assert len(others) == 3
        assert page.problems == [] and dark.problems == []  # type: ignore[attr-defined]


async def _rows_are(page: object, ids: list[str]) -> bool:
    rows = page.locator("#sessions tbody tr")  # type: ignore[attr-defined]
    found = [await r.get_attribute("data-session-id") for r in await rows.all()]
    return found == ids
