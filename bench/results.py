"""Render the recorded benchmark runs (bench/results/*.jsonl) as Markdown.

Each line of a results file is one run, written by bench/record.py (``source``
``recorded``) or carried over from the README's history (``source`` ``README history``,
with the date of the commit that wrote the figure there and the machine and command the
README named). The docs site's build calls ``render_markdown`` (scripts/docs_hooks.py);
run this file to print the page.

Example:
    .venv/bin/python bench/results.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REQUIRED = ("bench", "date", "machine", "command", "source", "figures")


def load_results(directory: Path = RESULTS) -> dict[str, list[dict[str, Any]]]:
    """Every run by benchmark name, newest first; a malformed line is an error naming it."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            missing = [key for key in REQUIRED if key not in record]
            if missing:
                raise ValueError(f"{path.name}:{number}: missing {', '.join(missing)}")
            runs.setdefault(record["bench"], []).append(record)
    for records in runs.values():
        records.sort(key=lambda r: str(r["date"]), reverse=True)
    return runs


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("|", "\\|").replace("\n", " ")


def _run(record: dict[str, Any]) -> list[str]:
    commit = f", commit `{record['commit']}`" if record.get("commit") else ""
    lines = [
        f"**{record['date']}** · {record['source']}{commit}",
        "",
        f"- machine: {record['machine']}",
        f"- command: `{record['command']}`",
    ]
    if record.get("note"):
        lines.append(f"- note: {record['note']}")
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| `{key}` | {_cell(value)} |" for key, value in record["figures"].items()]
    return [*lines, ""]


def render_markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    out = [
        "# Benchmark results",
        "",
        "Generated from `bench/results/*.jsonl` when the site is built. Each run shows its",
        "date, the machine it ran on and the command that made it. Runs labelled",
        "*README history* were carried over from the README as it was before the docs site:",
        "their date is the day the figure was committed there and their machine and command",
        "are the ones the README named. Record a new run with",
        "`.venv/bin/python bench/record.py NAME [ARGS...]` (see [Benchmarks](index.md)).",
        "",
    ]
    for name in sorted(runs):
        out += [f"## {name}", ""]
        for record in runs[name]:
            out += _run(record)
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown(load_results()))
