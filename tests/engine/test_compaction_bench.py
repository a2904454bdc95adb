"""``bench/compaction.py`` stays importable and its quick run says what the benchmark
claims: the scripted task's answer needs the step-5 fact, elision alone loses it, and
compaction keeps every request under the budget with the baseline's answer (through the
summary, or through ``recall`` when a terse policy summarized it away)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import compaction as bench


def test_the_scripted_pages_hold_the_fact_on_page_five_only() -> None:
    shape = bench.QUICK
    assert bench.CODE in bench.page_text(bench.FACT_PAGE, shape.steps, shape.page_tokens)
    others = (bench.page_text(n, shape.steps, shape.page_tokens) for n in (1, 4, 6, 60))
    assert not any(bench.CODE in text for text in others)
    assert abs(len(bench.page_text(7, 200, 2000)) - 8000) < 100  # ~2,000 tokens a page


@pytest.mark.slow
def test_the_quick_run_keeps_the_fact_under_the_budget(tmp_path: Path) -> None:
    figures = bench.sessions_part(tmp_path, bench.QUICK)
    base, compacted = figures["baseline"], figures["compaction"]
    assert base["fact_survived"] and not base["under_budget"]
    assert not figures["elision_only"]["fact_survived"]  # the budget alone loses it
    assert compacted["under_budget"] and compacted["compactions"] >= 2
    assert figures["same_answer"] and compacted["repeated_pages"] == 0
    assert figures["tokens_fewer_ratio"] > 0.5
    forks = figures["policies_on_forks"]
    assert forks["keep_facts"]["recalls"] == 0 and forks["keep_facts"]["fact_in_summary"]
    assert forks["keep_facts"]["fact_survived"]
    assert forks["terse"]["recalls"] == 1 and not forks["terse"]["fact_in_summary"]
    assert forks["terse"]["fact_survived"]
    assert forks["terse"]["shares_events"] == forks["prefix_events"]
    # forked far over the budget: the first summary sees only what fits, recall the rest
    assert forks["late_start"]["fact_survived"] and forks["late_start"]["recalls"] == 1
