"""``lodger replay``: a recorded session's inputs again, with another model, on a fork."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from lodger.cli._common import (
    location,
    make_console,
    retain_until_exit,
    session_argument,
    state_option,
)
from lodger.cli._render import visible
from lodger.cli._toolsfile import load_tools_file
from lodger.errors import ConfigError
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.composition import Overrides, compose
from lodger.runtime.project import Project
from lodger.runtime.replay import ReplayPolicy, ReplayResult, replay
from lodger.runtime.sessions import Sessions
from lodger.tools.spec import Tool

__all__ = ["COMMANDS", "replay_command", "report_table", "summary_line", "write_json"]


@click.command("replay")
@session_argument
@click.option(
    "--model", "model_spec", required=True, metavar="SPEC", help="The model to replay with."
)
@click.option(
    "--at",
    "at",
    type=click.IntRange(min=1),
    default=None,
    metavar="OFFSET",
    help="Fork at this offset (a turn's start; default: before the first turn).",
)
@click.option(
    "--turn",
    "turn",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Fork just before turn N (numbered from 1) and replay it and the turns after.",
)
@click.option(
    "--tools",
    "tools_files",
    multiple=True,
    metavar="FILE.py",
    help="Bind the tools defined in FILE.py (as `lodger run --tools`); it may also register "
    "model functions for function:NAME specs.",
)
@click.option("--system", "system", default=None, metavar="TEXT", help="Another system prompt.")
@click.option("--no-recorded", is_flag=True, help="Never answer a call from the recorded result.")
@click.option("--no-live", is_flag=True, help="Never run read-only tools live.")
@click.option("--no-sandbox", is_flag=True, help="Park every call with effects (no sandbox).")
@click.option("--as", "new_id", default=None, metavar="ID", help="The replay's session id.")
@click.option(
    "--json",
    "json_file",
    default=None,
    metavar="FILE",
    help="Write the report as JSON to FILE ('-': stdout, instead of the table).",
)
@state_option
def replay_command(
    session_id: str,
    model_spec: str,
    at: int | None,
    turn: int | None,
    tools_files: Sequence[str],
    system: str | None,
    no_recorded: bool,
    no_live: bool,
    no_sandbox: bool,
    new_id: str | None,
    json_file: str | None,
    state: str,
) -> None:
    """Replay SESSION's user inputs with another model on a copy-free fork.

    A call the source made (same tool and arguments) is answered from its recorded
    result; a read-only tool runs live; a tool with effects runs only in a sandbox on a
    scratch copy of the workspace as the log recorded it, or is parked (not run). Nothing
    the replay does reaches the real workspace or the world. The report says where the
    two trajectories diverge, the calls added and removed, the answers side by side, and
    tokens and cost; the fork stays, to inspect with `lodger log show`.

    \b
    Example:
      lodger replay SESSION --model openai:gpt-4.1
      lodger replay SESSION --turn 2 --model script:other.json --json report.json
      lodger replay --last --model function:candidate --tools candidate.py --no-sandbox
    """
    policy = ReplayPolicy(recorded=not no_recorded, live=not no_live, sandbox=not no_sandbox)
    tools: list[Tool] = []
    for path in tools_files:
        tools.extend(load_tools_file(path))
    done = _run(session_id, model_spec, at, turn, tools, system, policy, new_id)
    report = done.to_dict()
    if json_file == "-":
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    make_console().print(report_table(report))
    click.echo(summary_line(report))
    if json_file is not None:
        write_json(Path(json_file), report)
        click.echo(f"report written to {json_file}")


def _run(
    session_id: str,
    model_spec: str,
    at: int | None,
    turn: int | None,
    tools: list[Tool],
    system: str | None,
    policy: ReplayPolicy,
    new_id: str | None,
) -> ReplayResult:
    import asyncio

    async def work() -> ReplayResult:
        async with Sessions(location().open()) as sessions:
            retain_until_exit(sessions)
            recorded = await sessions.defaults(session_id)
            root = Path(recorded.workspace) if recorded.workspace else None
            present = root is not None and root.is_dir()
            # the project the session ran with; a replay reads its rules, never its model
            project = Project.load(root) if present and root is not None else Project.none()
            extra = [*workspace_tools()] if root is not None and not present else []
            binding = compose(
                project, Overrides(model=model_spec, tools=[*extra, *tools], approve_all=True)
            )
            try:
                return await replay(
                    sessions,
                    session_id,
                    binding=binding,
                    at=at,
                    turn=turn,
                    policy=policy,
                    system=system,
                    session=new_id,
                )
            finally:
                if not isinstance(binding.model, str):
                    await binding.model.aclose()

    return asyncio.run(work())


def write_json(path: Path, report: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the report to {path}: {exc.strerror or exc}",
            hint="give a path in a directory you can write",
        ) from exc


def _calls(step: dict[str, Any] | None) -> str:
    if step is None:
        return "(ended)"
    if not step["calls"]:
        return f"answer: {visible(step['text'])[:60]!s}"
    return ", ".join(
        f"{c['tool']}({visible(json.dumps(c['arguments'], ensure_ascii=False))[:50]})"
        for c in step["calls"]
    )


def _cost(usage: dict[str, Any]) -> str:
    micro = usage["cost_micro_usd"]
    return "?" if micro is None else f"${micro / 1_000_000:.4f}"


def summary_line(report: dict[str, Any]) -> str:
    """One line: whether and where the two trajectories diverge."""
    diverged = report["diverged_at"]
    if diverged is None:
        return "the trajectories agree"
    return f"the trajectories diverge at step {diverged['step']}"


def report_table(report: dict[str, Any]) -> Table:
    """The report as a table: what the source and the replay did, row by row."""
    diverged = report["diverged_at"]
    table = Table(title=f"replay {report['replay_session']} of {report['source_session']}")
    table.add_column("")
    table.add_column("source")
    table.add_column("replay")
    models = report["models"]
    table.add_row("model", str(models["source"]), str(models["replay"]))
    if diverged is not None:
        table.add_row(
            f"step {diverged['step']}", _calls(diverged["source"]), _calls(diverged["replay"])
        )
    table.add_row("steps", str(report["steps"]["source"]), str(report["steps"]["replay"]))
    removed = ", ".join(c["tool"] for c in report["calls"]["removed"]) or "-"
    added = ", ".join(c["tool"] for c in report["calls"]["added"]) or "-"
    table.add_row("calls only here", removed, added)
    for answer in report["answers"]:
        table.add_row(
            f"answer, turn {answer['turn']}",
            visible(str(answer["source"]))[:80],
            visible(str(answer["replay"]))[:80],
        )
    usage = report["usage"]
    for side in ("source", "replay"):
        u = usage[side]
        usage[side]["shown"] = f"{u['input_tokens']} in / {u['output_tokens']} out, {_cost(u)}"
    table.add_row("tokens, cost", usage["source"].pop("shown"), usage["replay"].pop("shown"))
    answered = ", ".join(f"{n} {how}" for how, n in report["answered"].items() if n) or "-"
    table.add_row("calls answered", "", answered)
    return table


COMMANDS = (replay_command,)
