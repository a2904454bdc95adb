"""``lodger compact``: summarize a session's context now, as a ``compacted`` fact.

The summary is written by the model of the workspace's ``[compaction]`` (a trusted
``lodger.toml``), else ``--model``, else the model the session last ran with; the fact
names what it covers, what it dropped and pinned, and the token estimates before and
after. Nothing is rewritten: ``lodger log show`` still shows every fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

import click

from lodger.cli._common import (
    echo_json,
    json_option,
    location,
    make_console,
    refuse_empty,
    remember_control,
    require_log,
    retain_until_exit,
    session_argument,
    state_option,
    storage_flags,
)
from lodger.cli._render import visible
from lodger.errors import ConfigError
from lodger.events import Compacted, Event
from lodger.runtime.sessions import Binding, Sessions

__all__ = ["COMMANDS", "compact"]


@click.command()
@session_argument
@click.option(
    "--instructions",
    metavar="TEXT",
    default=None,
    help="Extra text for the summarizer (what to keep, what matters next).",
)
@click.option(
    "--model",
    "model_spec",
    metavar="SPEC",
    default=None,
    help="The model that writes the summary (default: the project's [compaction] model, "
    "else the session's last model).",
)
@click.option(
    "--trust",
    is_flag=True,
    help="Trust the workspace's lodger.toml (its [compaction] model may be used).",
)
@click.option(
    "--control",
    metavar="DSN",
    default=None,
    envvar="LODGER_CONTROL",
    show_envvar=True,
    help="The control plane of the workers that run this session (default: the state "
    "directory's, when a worker made one): refused while a worker runs it.",
    callback=remember_control,
)
@state_option
@json_option
def compact(
    session_id: str,
    instructions: str | None,
    model_spec: str | None,
    trust: bool,
    control: str | None,
    state: str,
    as_json: bool,
) -> None:
    """Compact SESSION's context now: a summary of its history, recorded as a fact.

    The next request of the session sends the system prompt, what is pinned (the open
    turn's input, open todo items, files edited, waiting approvals), this summary and
    every fact after it, instead of the whole history. The log keeps every fact: `lodger
    log show` still shows them, `recall` fetches them back. Refused while a run of the
    session is open (resume or abandon an interrupted one first).

    SESSION is an id, a unique prefix of one, or --last.

    \b
    Example:
      lodger compact SESSION
      lodger compact --last --instructions "keep the failing test names"
      lodger compact SESSION --model openai:gpt-4.1-mini --json
    """
    refuse_empty(instructions, "--instructions", hint="leave it out, or say what to keep")
    refuse_empty(model_spec, "--model", hint="leave it out for the session's own model")
    where = location()
    dsn = control or where.control_dsn(create=False)
    made, event = _run(
        session_id, instructions=instructions, model_spec=model_spec, trust=trust, dsn=dsn
    )
    offset = event.offset if event is not None else None
    if as_json:
        echo_json({"session_id": session_id, "offset": offset, "compacted": made.model_dump()})
        return
    for line in describe(session_id, made, offset):
        click.echo(line)


def _run(
    session_id: str,
    *,
    instructions: str | None,
    model_spec: str | None,
    trust: bool,
    dsn: str | None,
) -> tuple[Compacted, Event | None]:
    from lodger.cli._recover import _outside_turns  # the lease decide and abandon take

    state_dir = location().state

    async def work() -> tuple[Compacted, Event | None]:
        async with Sessions(location().open()) as sessions:
            retain_until_exit(sessions)
            require_log(sessions.storage.log, state_dir, session_id)
            recorded = await sessions.defaults(session_id)
            binding = _binding(recorded.model, recorded.workspace, model_spec, trust)
            try:
                async with _outside_turns(dsn, session_id):
                    with _waiting(binding, session_id):
                        made = await sessions.compact(
                            session_id, instructions=instructions, binding=binding
                        )
            finally:
                if not isinstance(binding.model, str):
                    await binding.model.aclose()
            folded = sessions.cached(session_id)
            last = folded.events[-1] if folded is not None and folded.events else None
            return made, last if last is not None and isinstance(last.body, Compacted) else None

    return asyncio.run(work())


def _waiting(binding: Binding, session_id: str) -> contextlib.AbstractContextManager[object]:
    """A spinner on a terminal's stderr while the summary model is asked (nothing when
    stderr is a file or a pipe)."""
    console = make_console(stderr=True)
    if not console.is_terminal:
        return contextlib.nullcontext()
    policy = binding.compaction
    model = policy.model if policy is not None and policy.model else binding.model
    spec = model if isinstance(model, str) else model.spec  # the summary model's
    return console.status(f"asking {visible(spec)} for a summary of {session_id}...")


def _binding(
    recorded_model: str | None, workspace: str | None, model_spec: str | None, trust: bool
) -> Binding:
    """The one composition, with no tools: the project of the session's workspace (its
    ``[compaction]``) when the directory is still there, the model named or recorded."""
    from lodger.cli._run import load_project
    from lodger.runtime.composition import Overrides, compose, model_spec_for

    root = Path(workspace) if workspace else None
    project = load_project(root if root is not None and root.is_dir() else None, trust=trust)
    overrides = Overrides(model=model_spec, recorded_model=recorded_model, builtin_tools=False)
    policy = project.compaction
    if model_spec_for(project, overrides) is None and policy is not None and policy.model:
        overrides = dataclasses.replace(overrides, model=policy.model)  # it writes the summary
    if model_spec_for(project, overrides) is None and overrides.model is None:
        raise ConfigError(
            "no model to write the summary with: the session never ran one",
            hint="pass --model SPEC",
        )
    if model_spec is not None and policy is not None and policy.model is not None:
        policy = dataclasses.replace(policy, model=model_spec)  # the flag wins over the file
    return compose(project, dataclasses.replace(overrides, compaction=policy))


def describe(session_id: str, made: Compacted, offset: int | None) -> list[str]:
    """What the compaction covered, the tokens before and after, what it dropped."""
    covers = made.covers
    at = f" at offset {offset}" if offset is not None else ""
    before, after = made.tokens_before, made.tokens_after
    change = ""
    if before > 0 and after != before:
        ratio = abs(1 - after / before)
        change = f" ({ratio:.0%} {'fewer' if after < before else 'more'})"
    calls = len(made.dropped_call_ids)
    lines = [
        f"compacted {session_id}{at}: covers events [0, {covers.high_water}) "
        f"(digest {covers.digest[:16]})",
        f"  tokens: ~{before:,} -> ~{after:,}{change}",
        f"  dropped: {calls} tool result{'s' if calls != 1 else ''}, "
        f"{made.dropped_bytes:,} bytes (~{made.dropped_tokens:,} tokens); the log keeps them "
        "(recall fetches them back)",
    ]
    if made.pinned:
        lines.append("  pinned: " + ", ".join(made.pinned))
    if made.previous is not None:
        lines.append(f"  chains the compaction at offset {made.previous}")
    lines.append(f"  summary by {made.model} ({len(made.summary):,} chars)")
    flags = storage_flags()
    lines.append(f"  see it: lodger log show {session_id}{flags} --all")
    return lines


COMMANDS = (compact,)
