"""``lodger eval``: run an eval file's suites, print a table, write the JSON report."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from lodger.cli._common import location, make_console, retain_until_exit, state_option
from lodger.cli._render import visible
from lodger.cli._replay import write_json
from lodger.errors import ConfigError

__all__ = ["COMMANDS", "compare_line", "compare_table", "eval_command", "run_table"]


@click.command("eval")
@click.argument("file", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--suite", "only", multiple=True, metavar="NAME", help="Run only this suite.")
@click.option(
    "--model",
    "model_spec",
    default=None,
    metavar="SPEC",
    help="Run every suite with this model instead of its own (to compare two models).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Cases run at once (default: each suite's own).",
)
@click.option(
    "--json", "json_file", default=None, metavar="FILE", help="Write the report as JSON to FILE."
)
@click.option(
    "--baseline",
    "baseline",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A report an earlier run wrote: compare each suite with it, side by side.",
)
@state_option
def eval_command(
    file: Path,
    only: tuple[str, ...],
    model_spec: str | None,
    concurrency: int | None,
    json_file: str | None,
    baseline: Path | None,
    state: str,
) -> None:
    """Run the eval suites FILE defines: each case as a turn on a session of its own.

    FILE is a Python file that defines lodger.evals.EvalSuite objects (a pydantic-evals
    Dataset of cases, graders, and the binding they run on). Each case's verdicts are
    recorded as eval_scored facts on its session (in --state or --store) and in the JSON
    report. Exits 1 when a case fails.

    \b
    Example:
      lodger eval evals/support.py --json run.json
      lodger eval evals/support.py --baseline run.json --concurrency 8
      lodger eval evals/support.py --model anthropic:claude-sonnet-4-5 --baseline run.json
    """
    from lodger.evals import compare_runs, load_suites, run_suite

    suites = [s for s in load_suites(file) if not only or s.name in only]
    if not suites:
        raise ConfigError(f"{file} has no suite named {', '.join(only)}", hint="check --suite")
    before = _read_baseline(baseline) if baseline is not None else None

    async def work() -> list[dict[str, Any]]:
        from dataclasses import replace

        from lodger.runtime.sessions import Sessions

        async with Sessions(location().open()) as sessions:
            retain_until_exit(sessions)
            runs = []
            for suite in suites:
                chosen = suite if concurrency is None else replace(suite, concurrency=concurrency)
                if model_spec is not None:
                    chosen = replace(chosen, binding=replace(chosen.binding, model=model_spec))
                runs.append((await run_suite(chosen, sessions)).to_dict())
            return runs

    runs = asyncio.run(work())
    console = make_console()
    for run in runs:
        console.print(run_table(run))
        s = run["summary"]
        click.echo(
            f"{run['suite']} ({run['model']}): {s['passed']} of {s['cases']} passed "
            f"(eval run {run['eval_run']})"
        )
        old = (before or {}).get(run["suite"])
        if old is not None:
            comparison = compare_runs(old, run)
            console.print(compare_table(comparison))
            click.echo(compare_line(comparison))
    if json_file is not None:
        write_json(Path(json_file), {"runs": runs})
        click.echo(f"report written to {json_file}")
    if any(run["summary"]["failed"] for run in runs):
        sys.exit(1)


def _read_baseline(path: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return {run["suite"]: run for run in raw["runs"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a report `lodger eval --json` wrote: {exc}",
            hint="pass the JSON file an earlier `lodger eval FILE --json` wrote",
        ) from exc


def _verdicts(case: dict[str, Any]) -> str:
    marks = "".join("✔" if a["value"] else "✗" for a in case["assertions"].values())
    scores = " ".join(f"{k}={v['value']:.2f}" for k, v in case["scores"].items())
    return " ".join(part for part in (marks, scores) if part)


def run_table(run: dict[str, Any]) -> Table:
    """One suite's run: a row per case, its verdicts, its answer and its session."""
    s = run["summary"]
    table = Table(title=f"{run['suite']}: {s['passed']} of {s['cases']} passed")
    for column in ("case", "passed", "verdicts", "answer", "session"):
        table.add_column(column)
    for case in run["cases"]:
        answer = case["error"] or case["output"]
        table.add_row(
            visible(case["name"]),
            "yes" if case["passed"] else "NO",
            _verdicts(case),
            visible(str(answer))[:60],
            str(case["session_id"] or "-"),
        )
    return table


def compare_line(comparison: dict[str, Any]) -> str:
    """One line: how many passed before and now, how many were fixed and broke."""
    s = comparison["summary"]
    return (
        f"{comparison['baseline']['model']} -> {comparison['current']['model']}: "
        f"{s['baseline']['passed']} -> {s['current']['passed']} passed, "
        f"{s['fixed']} fixed, {s['broke']} broke"
    )


def compare_table(comparison: dict[str, Any]) -> Table:
    """Two runs of a suite side by side, a row per case."""
    table = Table(title="baseline and current, side by side")
    for column in ("case", "baseline", "current", "change"):
        table.add_column(column)
    for row in comparison["cases"]:
        table.add_row(
            visible(row["name"]), _short(row["baseline"]), _short(row["current"]), row["change"]
        )
    return table


def _short(side: dict[str, Any] | None) -> str:
    if side is None:
        return "-"
    scores = " ".join(f"{k}={v:.2f}" for k, v in side["scores"].items())
    return ("pass" if side["passed"] else "FAIL") + (f" {scores}" if scores else "")


COMMANDS = (eval_command,)
