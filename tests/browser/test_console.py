"""The operator console in Debian's headless Chromium, against a real ``lodger serve``
subprocess and a real store (a ``--state`` directory; a ``file://`` object store): find a
session by search, read a call's arguments and result (a large one from its artifact),
hostile text kept as text, approve a parked call by clicking, see facts arrive live,
recover a turn whose ``lodger run`` process was SIGKILLed mid-call and fork it. Each test
keeps screenshots (under ``$LODGER_TEST_ARTIFACTS``) and checks the main pages with
axe-core."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from playwright.async_api import Locator, Page

from lodger.client import HostClient

from ._console import (
    TOOLS,
    artifacts_dir,
    axe_violations,
    chromium,
    lodger_env,
    new_page,
    script,
    serve,
    shot,
    wait_for,
)

pytestmark = pytest.mark.slow

HOSTILE = "<img src=x onerror=\"document.title='pwned'\"> \u202egnp.exe\u202c bell\u0007 end"
CELL = "const r = await tools.echo({text: '<i>nested</i>'}); return r;"
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
            {"calls": [{"name": "exec", "args": {"code": CELL}}]},
            {"text": "done <b>not bold</b>"},
        ],
    )
    where = artifacts_dir(tmp_path)
    # a parent and its subagent, made by `lodger run --subagents` on the same state
    delegating = script(
        tmp_path / "d.json",
        [{"calls": [{"name": "delegate", "args": {"task": "count", "tools": ["echo"]}}]},
         {"text": "all done"}],
    )  # fmt: skip
    argv = [sys.executable, "-m", "lodger", "run", "delegate it", "--subagents", "--session"]
    argv += ["p1", "--model", delegating, "--state", str(tmp_path / "state")]
    argv += ["--workspace", str(tmp_path), "--tools", str(TOOLS)]
    ran = await asyncio.to_thread(
        subprocess.run, argv, env=lodger_env(gates), cwd=tmp_path, capture_output=True
    )
    assert ran.returncode == 0, ran.stderr
    async with (
        serve(
            ["--state", str(tmp_path / "state"), "--code-mode", "javascript"],
            model,
            gates,
            tmp_path / "host.out",
        ) as host,
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
        # the subagent under its parent, and under the parent's delegate call
        await page.locator("#search").fill("")
        child = page.locator("tr.child", has_text="subagent of p1")
        await child.wait_for()
        child_id = await child.get_attribute("data-session-id")
        await page.get_by_role("link", name="p1", exact=True).click()
        delegate = page.locator(".call", has_text="delegate").first
        await delegate.get_by_role("button", name="nested calls (1)").click()
        link = delegate.locator(".subagent-child a")
        assert await link.inner_text() == child_id
        await delegate.locator(".subagent-child", has_text="completed").wait_for()
        await page.get_by_role("link", name="Sessions").click()
        await page.locator("#search").fill("needle")
        await wait_for(lambda: _rows_are(page, ["needle-session"]))
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
        # by keyboard: a call's details open with Enter on its button
        second = page.locator(".call").nth(1).locator("button.toggle")
        await second.focus()
        await page.keyboard.press("Enter")
        assert await second.get_attribute("aria-expanded") == "true"
        # the large result: a preview in T2, the whole from the artifact route
        big = page.locator(".call").nth(1)
        load = big.get_by_role("button", name="Load the full result")
        await load.click()
        await big.locator("pre.artifact").wait_for()  # shown once its bytes arrived
        full = await big.locator("pre.artifact").inner_text()
        assert full.count("line of a long result") == 1200
        # the code cell's nested call, folded under the cell
        facts = await c.events(sid)
        cell_id = next(
            f.data["call_id"]
            for f in facts
            if f.kind == "tool_dispatched" and f.data["body"]["tool"] == "exec"
        )
        cell = page.locator(f'.call[data-call-id="{cell_id}"]')
        fold = cell.get_by_role("button", name="nested calls (1)")
        nested = cell.locator(".nested .call")
        assert not await nested.is_visible()
        await fold.click()
        await nested.locator("button.toggle").click()
        assert "<i>nested</i>" in await nested.locator("pre.result-text").inner_text()
        assert await page.locator("i").count() == 0
        # switch the permission mode from the control panel: a fact naming the token
        await page.locator("#mode").select_option("plan")
        await page.get_by_role("button", name="Switch").click()
        await page.locator(
            ".note.control", has_text="permission mode none → plan by token:"
        ).wait_for()
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


async def test_approve_by_clicking_and_see_facts_arrive_live_on_a_file_store(
    tmp_path: Path, gates: Path
) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {"calls": [{"name": "gate", "args": {"name": "live"}}]},
            {"calls": [{"name": "deploy", "args": {"target": "prod"}}]},
            {"calls": [{"name": "deploy", "args": {"target": "staging"}}]},
            {"calls": [{"name": "deploy", "args": {"target": "dev"}}]},
            {"text": "shipped"},
        ],
    )
    where = artifacts_dir(tmp_path)
    storage = ["--store", (tmp_path / "store").as_uri(), "--host-index", str(tmp_path / "h.db")]
    async with (
        serve(storage, model, gates, tmp_path / "host.out") as host,
        host.client() as c,
        chromium() as browser,
    ):
        sid = await c.create_session()
        page = await new_page(browser)
        await page.goto(host.console(f"/session/{sid}"))
        await page.locator("#session-id").wait_for()
        sent = await c.send(sid, "ship it", key="1")
        # a fact arriving live: the gate call shows as running while it runs
        running = page.locator('.call[data-status="running"]')
        await running.wait_for()
        assert "gate" in await running.inner_text()
        await shot(page, where, "live-running")
        # steer the running turn from the control panel: delivered at the next step
        await page.locator("#steer-text").fill("<script>x</script> use the blue deploy")
        await page.get_by_role("button", name="Steer", exact=True).click()
        steered = page.locator(".note.control", has_text="steer by token:tok_")
        await steered.wait_for()
        assert "<script>x</script> use the blue deploy" in await steered.inner_text()
        (gates / "live").touch()
        await page.locator(".note.control", has_text="steer delivered at step 1").wait_for()
        # the inbox: the parked call with its arguments, allowed once by a click
        await page.get_by_role("link", name="Approvals").click()
        approval = page.locator("section.approval")
        await approval.wait_for()
        assert '"target": "prod"' in await approval.locator("pre.arguments").inner_text()
        await shot(page, where, "approvals")
        assert not await axe_violations(page)
        await approval.get_by_role("button", name="Allow once").click()
        await page.locator(".call-state", has_text="allow by token:tok_").wait_for()
        # the next one from the session's own page: allowed always, so the third is not asked
        await page.goto(f"{host.url}/console#/session/{sid}")
        staging = page.locator('.call[data-status="parked"]')
        await staging.wait_for()
        await staging.get_by_role("button", name="Allow always").click()
        await page.locator(".note.end", has_text="turn completed: shipped").wait_for()
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["result"]["answer"] == "shipped"
        # each deploy ran and its T2 shows
        oks = page.locator('.call[data-status="ok"]')
        assert await oks.count() == 4
        assert "T2" in await oks.nth(1).inner_text()
        facts = await c.events(sid)
        decided = [f.data["body"] for f in facts if f.kind == "permission_decided"]
        assert [(d["decision"], d["by"]) for d in decided] == [("allow", "user")] * 3
        assert decided[0]["who"].startswith("token:tok_") and decided[1]["who"] == decided[0]["who"]
        # the third was not asked: the earlier "always" allowed it
        assert "allowed always" in decided[2]["reason"]
        assert sum(f.kind == "permission_requested" for f in facts) == 2
        shown = int(await page.locator("#timeline").get_attribute("data-last-offset") or -1)
        assert shown == facts[-1].offset
        await shot(page, where, "approved")
        assert page.problems == []  # type: ignore[attr-defined]


async def test_recover_a_turn_whose_process_was_killed_then_fork_it(
    tmp_path: Path, gates: Path
) -> None:
    """A ``lodger run`` child SIGKILLed inside a never-retry call leaves the turn open; the
    console shows its plan, decides the call, resumes the turn and forks the session."""
    model = script(
        tmp_path / "s.json",
        [
            {"calls": [{"name": "echo", "args": {"text": "before"}}]},
            {"calls": [{"name": "charge", "args": {"name": "card"}}]},
            {"text": "charged and done"},
        ],
    )
    state, sid = tmp_path / "state", "crashed-1"
    workspace = tmp_path / "ws" / sid  # where the host puts the session: --workspaces ws
    workspace.mkdir(parents=True)
    argv = [sys.executable, "-m", "lodger", "run", "charge the card", "--state", str(state)]
    argv += ["--model", model, "--tools", str(TOOLS), "--json", "--session", sid]
    argv += ["--workspace", str(workspace)]
    child = await asyncio.to_thread(
        subprocess.Popen,
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=lodger_env(gates),
        cwd=tmp_path,
    )
    try:
        await wait_for(lambda: _exists(gates / "card.starts"), within=30)
    finally:
        child.send_signal(signal.SIGKILL)
        out, _ = await asyncio.to_thread(child.communicate)
    facts = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert {f["event"]["session_id"] for f in facts if f.get("type") == "fact"} == {sid}
    assert not any(f.get("type") == "result" for f in facts)  # killed before its end
    where = artifacts_dir(tmp_path)
    async with (
        serve(
            ["--state", str(state), "--workspaces", str(tmp_path / "ws")],
            model,
            gates,
            tmp_path / "host.out",
        ) as host,
        host.client() as c,
        chromium() as browser,
    ):
        page = await new_page(browser)
        await page.goto(host.console())
        row = page.locator(f'tr[data-session-id="{sid}"]')
        await row.wait_for()
        assert await row.get_attribute("data-status") == "interrupted"
        await row.get_by_role("link").click()
        plan = page.locator('#plan li[data-action="park"], #plan li[data-action="wait_operator"]')
        await plan.wait_for()
        assert "charge" in await plan.inner_text()
        assert await page.locator("#resume").is_disabled() is (
            await plan.get_attribute("data-action") == "wait_operator"
        )
        await shot(page, where, "recovery")
        assert not await axe_violations(page)
        await plan.locator(".decide-result").fill("charged once, seen on the card's statement")
        await plan.get_by_role("button", name="It completed").click()
        await page.locator(".note.control", has_text="operator decision completed").wait_for()
        await page.locator("#resume:not([disabled])").click()
        await page.locator(".note.end", has_text="turn completed: charged and done").wait_for()
        after = await c.events(sid)
        decision = next(f.data for f in after if f.kind == "operator_decision")
        assert decision["body"]["who"].startswith("token:tok_")
        assert (gates / "card.starts").read_text().count("start") == 1  # never run twice
        # fork at an offset (here: all of it); the fork shows the history it shares, folded
        after = await c.events(sid)
        await page.locator("#offset").fill(str(len(after)))
        await page.get_by_role("button", name="Fork here").click()
        link = page.locator("#fork-link")
        await link.wait_for()
        fork_id = await link.inner_text()
        forked = await c.show(fork_id)
        assert forked["events"] == 1 and forked["turns"] == 0  # copy-free: its own event
        await link.click()
        await page.locator("#inherited", has_text=f"Continues {sid} from its first").wait_for()
        await page.get_by_role("button", name="Show the shared history").click()
        shared = page.locator(".inherited-facts")
        await shared.locator(".note.end", has_text="turn completed: charged and done").wait_for()
        assert "charge the card" in await shared.locator(".turn-input").inner_text()
        assert await shared.get_by_role("button", name="Fork before this turn").count() == 0
        await page.get_by_role("link", name="Sessions").click()
        child_row = page.locator(f'tr.child[data-session-id="{fork_id}"]')
        await child_row.wait_for()
        assert f"fork of {sid}" in await child_row.inner_text()
        await shot(page, where, "forked")
        # rewind the session to before its turn: it goes on in a new branch, listed under it
        await wait_for(lambda: _idle(c, sid))  # a rewind waits for the runner to end
        await row.get_by_role("link").click()
        await page.get_by_role("button", name="Rewind to before this turn").click()
        said = page.locator("#action-status")
        await wait_for(lambda: _says(said, "rewound: the session goes on in"))
        assert "rewound: the session goes on in" in await said.inner_text()
        shown = await c.show(sid)
        assert shown["branch"] != sid and shown["turns"] == 0
        await wait_for(lambda: _no_turns(page))  # the page reloaded on the branch
        await page.get_by_role("link", name="Sessions").click()
        branch = page.locator(f'tr.child[data-session-id="{shown["branch"]}"]')
        await branch.wait_for()
        assert f"branch of {sid}" in await branch.inner_text()
        assert page.problems == []  # type: ignore[attr-defined]


async def _says(line: Locator, text: str) -> bool:
    """The line says ``text``, or shows an error instead (the assertion after says which)."""
    return text in await line.inner_text() or await line.locator(".error").count() > 0


async def _no_turns(page: Page) -> bool:
    return await page.locator(".turn").count() == 0 and await page.locator("#timeline").count() == 1


async def _idle(c: HostClient, sid: str) -> bool:
    return not (await c.show(sid))["running"]


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_queue_retract_and_cancel_a_running_turn_by_clicking(
    tmp_path: Path, gates: Path
) -> None:
    model = script(
        tmp_path / "s.json",
        [{"calls": [{"name": "gate", "args": {"name": "never"}}]}, {"text": "not reached"}],
    )
    async with (
        serve(["--state", str(tmp_path / "state")], model, gates, tmp_path / "host.out") as host,
        host.client() as c,
        chromium() as browser,
    ):
        sid = await c.create_session()
        page = await new_page(browser)
        await page.goto(host.console(f"/session/{sid}"))
        await page.locator("#send-text").fill("wait for the gate")
        await page.get_by_role("button", name="Send", exact=True).click()
        await page.locator('.call[data-status="running"]').wait_for()
        # a follow-up queued while the turn runs, then retracted before it is delivered
        await page.locator("#queue-text").fill("then <u>this</u>")
        await page.get_by_role("button", name="Queue", exact=True).click()
        queued = page.locator("#queue-list li")
        await queued.wait_for()
        assert "enqueue: then <u>this</u>" in await queued.inner_text()
        await queued.get_by_role("button", name="Retract").click()
        await page.locator(".note.control", has_text="queue retract").wait_for()
        assert (await c.queue(sid))["messages"] == []
        # cancel with a reason: the running call settles, the turn ends cancelled
        await page.locator("#cancel-reason").fill("<i>enough</i>")
        await page.get_by_role("button", name="Cancel the turn").click()
        asked = page.locator(".note.control", has_text="cancel requested by token:tok_")
        await asked.wait_for()
        assert "<i>enough</i>" in await asked.inner_text()
        await page.locator(".note.end", has_text="turn cancelled").wait_for()
        await page.locator('.call[data-status="cancelled"]').wait_for()
        assert await page.locator("i").count() == 0 and await page.locator("u").count() == 0
        assert page.problems == []  # type: ignore[attr-defined]
