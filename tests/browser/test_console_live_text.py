"""Text deltas in the console: a turn's text shows as it arrives on the stream
(``?deltas=true``: transient, never facts) and each step's committed ``model_output``
replaces it, in Chromium against a real ``lodger serve``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._console import chromium, new_page, script, serve

pytestmark = pytest.mark.slow


WATCH_LIVE_TEXT = """() => {
  window.__live = [];
  new MutationObserver((changes) => {
    for (const change of changes) {
      const box = change.target.closest && change.target.closest(".text.live");
      if (box) window.__live.push(box.textContent);
      for (const node of change.addedNodes) {
        if (node.classList && node.classList.contains("live")) window.__live.push(node.textContent);
      }
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


async def test_text_arrives_live_and_the_committed_output_replaces_it(
    tmp_path: Path, gates: Path
) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Let me wait <b>here</b>.",
                "calls": [{"name": "gate", "args": {"name": "d"}}],
            },
            {"text": "Done: the gate is open."},
        ],
    )
    async with (
        serve(["--state", str(tmp_path / "state")], model, gates, tmp_path / "host.out") as host,
        host.client() as c,
        chromium() as browser,
    ):
        sid = await c.create_session()
        page = await new_page(browser)
        await page.goto(host.console(f"/session/{sid}"))
        await page.locator("#conn", has_text="live").wait_for()
        await page.evaluate(WATCH_LIVE_TEXT)
        sent = await c.send(sid, "go", key="1")
        await page.locator('.call[data-status="running"]').wait_for()
        (gates / "d").touch()
        await page.locator(".note.end", has_text="turn completed").wait_for()
        await c.wait_message(sid, sent["message"]["id"])
        # the deltas showed as live text; each step's committed text replaced its own
        live = await page.evaluate("window.__live")
        assert "Let me wait <b>here</b>." in live and "Done: the gate is open." in live
        assert await page.locator(".text.live").count() == 0
        texts = [await t.inner_text() for t in await page.locator(".step .text").all()]
        assert texts == ["Let me wait <b>here</b>.", "Done: the gate is open."]
        assert await page.locator("b").count() == 0
        assert page.problems == []  # type: ignore[attr-defined]
