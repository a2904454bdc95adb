"""Every kind of fact the console draws, from the golden logs of schema 9 and 10 (session
control, background processes, long calls, rewinds, elicitations, sampling, replays and
evals), loaded into a real state directory and opened in Chromium through a real host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lodger.storage import Record, Storage

from ._console import chromium, new_page, serve

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parents[1] / "data" / "golden"

SHOWN = {
    "v9_control.jsonl": [
        "permission mode",
        "steer by",
        "compaction failed (",
        "compacted [0, ",
        "steer delivered at step",
        " started (pid ",
        "accepted: running remotely",
        "bytes of output",
        "queued (",
        "queue ",
        "cancel requested",
        "rewound to [0, ",
    ],
    "v10_extensions.jsonl": [
        "replay of ",
        "elicitation from ",
        "elicitation accept",
        "sampling requested by ",
        "sampling answered by ",
        "tools of ",
        "call replayed from ",
        "eval ",
    ],
}


async def _load(state: Path, name: str) -> str:
    rows = [json.loads(line) for line in (GOLDEN / name).read_text().splitlines()]
    records = [Record(r["offset"], r["data"].encode("utf-8"), r["digest"]) for r in rows]
    sid = str(json.loads(rows[0]["data"])["session_id"])
    storage = Storage.local(state)
    try:
        await storage.log.store.append_records(session_id=sid, records=records, expected_offset=0)
    finally:
        await storage.close()
    return sid


async def test_the_console_draws_every_kind_of_control_and_extension_fact(
    tmp_path: Path, gates: Path
) -> None:
    state = tmp_path / "state"
    sessions = {name: await _load(state, name) for name in SHOWN}
    async with (
        serve(["--state", str(state)], "test", gates, tmp_path / "host.out") as host,
        chromium() as browser,
    ):
        page = await new_page(browser)
        await page.goto(host.console())
        for name, expected in SHOWN.items():
            await page.goto(host.console(f"/session/{sessions[name]}"))
            await page.locator("#session-id", has_text=sessions[name]).wait_for()
            await page.wait_for_function(
                "n => (document.querySelector('#timeline') || {dataset: {}})"
                ".dataset.lastOffset == n",
                arg=str(len((GOLDEN / name).read_text().splitlines()) - 1),
            )
            notes = " | ".join(await page.locator("#timeline .note").all_inner_texts())
            missing = [text for text in expected if text not in notes]
            assert not missing, (name, missing, notes)
            assert await page.locator("#timeline .note.other", has_text="_").count() == 0
            if name == "v9_control.jsonl":
                assert "unknown_operation" in await page.locator("#session-error").inner_text()
        # v9's golden is a log the runtime cannot fold (a long call with no T1): its state
        # answers 500 (the browser logs that), and the page says so and shows the facts
        problems = page.problems  # type: ignore[attr-defined]
        assert [p for p in problems if "status of 500" not in p] == []
