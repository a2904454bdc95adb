"""The ``lodger`` command line.

``main`` is the root click group (and the console script). Commands live in private
modules, one concept each, that export ``COMMANDS``; name each command and its module in
``_COMMANDS`` to register it. A module is imported only when one of its commands runs (or
``--help`` lists them), so ``lodger log show`` does not pay for the agent, the host or the
workers at start-up. Shared options and helpers are in :mod:`lodger.cli._common`.

Errors: any :class:`~lodger.errors.LodgerError` that escapes a command prints
``error: <message>`` and ``hint: <hint>`` on stderr and exits with the code of its kind
(``exit_code_for_error``), with no traceback unless ``--debug``. Ctrl-C exits 130 with
one line. The codes are documented in ``main``'s help (and docs/guides/cli.md).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import os
import sys
import threading
import traceback
from typing import Any

import click

from lodger.cli._common import location, storage_flags
from lodger.cli._next import command_for
from lodger.errors import LodgerError, ResumeBlockedError, SessionNotFoundError, UsageError

__all__ = [
    "EXIT_BLOCKED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_USAGE",
    "LodgerGroup",
    "exit_code_for_error",
    "main",
]

EXIT_ERROR = 1  # the turn failed, or the world did (provider, storage, corruption)
EXIT_USAGE = 2  # a bad command line, option or configuration
EXIT_BLOCKED = 3  # resume is blocked: a parked call waits for a decision, an invariant failed
EXIT_NOT_FOUND = 4  # no such session (or call) in the state directory
EXIT_INTERRUPTED = 130  # Ctrl-C (143 for SIGTERM, 129 for SIGHUP)


def exit_code_for_error(exc: LodgerError) -> int:
    if isinstance(exc, SessionNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, ResumeBlockedError):
        return EXIT_BLOCKED
    if isinstance(exc, UsageError) or exc.code in ("config", "script"):
        return EXIT_USAGE
    return EXIT_ERROR


# command name -> the module that defines it (in its ``COMMANDS``)
_COMMANDS: dict[str, str] = {
    "sessions": "lodger.cli._log",
    "log": "lodger.cli._log",
    "run": "lodger.cli._run",
    "demo": "lodger.cli._run",
    "recover": "lodger.cli._recover",
    "decide": "lodger.cli._recover",
    "compact": "lodger.cli._compact",
    "resume": "lodger.cli._recover",
    "abandon": "lodger.cli._recover",
    "cancel": "lodger.cli._cancel",
    "mode": "lodger.cli._mode",
    "tools": "lodger.cli._tools",
    "fork": "lodger.cli._fork",
    "rewind": "lodger.cli._rewind",
    "replay": "lodger.cli._replay",
    "eval": "lodger.cli._eval",
    "serve": "lodger.cli._serve",
    "worker": "lodger.cli._control",
    "send": "lodger.cli._control",
    "schedule": "lodger.cli._control",
    "trust": "lodger.cli._trust",
    "store": "lodger.cli._store",
    "mcp": "lodger.cli._mcp_login",
}


def _one_line(text: str) -> str:
    # a message may quote stored values: their control characters are shown, never sent
    from lodger.cli._render import visible

    return visible(" ".join(text.split()))


def _leave_without_teardown(code: object) -> None:
    """End a process that used the object store without the interpreter's teardown.

    obstore runs its requests on a Rust (tokio) runtime whose threads outlive the
    command; when one touches Python while the interpreter finalizes, the process
    aborts (SIGABRT, exit 134) after the command's work was done and its output printed:
    measured 4-6 processes in 40 that appended to an S3 store and returned. So once a
    command is done, the exit handlers run (they flush telemetry and logs) and the process
    leaves with ``os._exit``: 0 aborts in 60.

    The same exit serves every command when no thread is left that an ordinary exit
    would wait for (only daemon threads remain): the teardown it skips frees, one by one,
    every object a long session's open left behind (measured: 50 ms after `lodger resume`
    of 100k events, with nothing left to write: the log is closed, the exit handlers run,
    stdout and stderr are flushed). A command that left a non-daemon thread exits as usual,
    and so does one that ran a user's tools file (``--tools``): the teardown flushes and
    closes what that code may have left open (a module-level log file, say), which
    ``os._exit`` would drop.
    """
    waits = any(not t.daemon and t is not threading.main_thread() for t in threading.enumerate())
    loader = sys.modules.get("lodger.cli._toolsfile")
    user_code = loader is not None and getattr(loader, "user_code_loaded", False)
    if user_code:
        # What a user's tools left in reference cycles (a module-level log file kept by
        # a dropped tool) is finalized now, while the interpreter is whole: this process
        # collects its young generation rarely (lodger._core.collector), so no automatic
        # collection may have come since the tools were dropped.
        gc.collect()
    if "obstore" not in sys.modules and (waits or user_code):
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()  # the handlers an ordinary exit would run
    if user_code:  # here only with obstore loaded: flush what the teardown would have
        _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def _flush_open_files() -> None:
    """Flush every file object still open (what a user's code left buffered), as the
    teardown ``os._exit`` skips would have."""
    for obj in gc.get_objects():
        if isinstance(obj, io.BufferedIOBase | io.TextIOBase):
            with contextlib.suppress(Exception):  # closed, detached, a broken pipe ...
                obj.flush()


class LodgerGroup(click.Group):
    """A click group that turns lodger errors and Ctrl-C into one line and an exit code,
    and imports a command's module only when the command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _COMMANDS.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        for command in importlib.import_module(module).COMMANDS:
            if command.name == cmd_name:
                return command  # type: ignore[no-any-return]
        raise RuntimeError(f"{module} does not define the command {cmd_name!r}")

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        if args is None:  # the process's own command line: lodger owns this process
            from lodger._core.collector import tune_owned_process

            tune_owned_process()
        try:
            return super().main(args, *rest, **kwargs)
        except SystemExit as done:
            if args is None:  # the process's own command line, not a test's runner
                _leave_without_teardown(done.code)
            raise
        finally:
            if args is not None:  # a runner calls again: free what the command kept
                common = sys.modules.get("lodger.cli._common")
                if common is not None:
                    common._RETAINED.clear()

    def invoke(self, ctx: click.Context) -> Any:
        from lodger.cli._warnings import warnings_on_stderr

        wants_json = "--json" in ctx.args  # known before parsing, for usage errors too
        try:
            with warnings_on_stderr(as_json=wants_json, debug=bool(ctx.params.get("debug"))):
                return super().invoke(ctx)
        except click.UsageError as exc:
            if not wants_json:
                raise
            from lodger.cli._jsonl import echo_error, usage_error_document

            echo_error(usage_error_document(exc))
            ctx.exit(EXIT_USAGE)
        except LodgerError as exc:
            self._debug_traceback(ctx)
            if wants_json or ctx.meta.get("lodger.json"):  # errors under --json are JSON
                from lodger.cli._jsonl import echo_error, error_document

                echo_error(error_document(exc, storage_flags(location(ctx.meta))))
                ctx.exit(exit_code_for_error(exc))
            click.echo(f"error: {_one_line(exc.message)}", err=True)
            if exc.hint:
                click.echo(f"hint: {_one_line(exc.hint)}", err=True)
            for note in getattr(exc, "__notes__", ()):  # what failed after it, second
                click.echo(f"note: {_one_line(str(note))}", err=True)
            flags = storage_flags(location(ctx.meta))
            for step in exc.next_steps:
                click.echo(f"next: {command_for(step, flags)}", err=True)
            ctx.exit(exit_code_for_error(exc))
        except KeyboardInterrupt:
            self._debug_traceback(ctx)
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)

    @staticmethod
    def _debug_traceback(ctx: click.Context) -> None:
        if ctx.params.get("debug"):
            click.echo(traceback.format_exc().rstrip(), err=True)


@click.group(cls=LodgerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    default=False,
    envvar="LODGER_DEBUG",
    help="Show tracebacks for errors (also LODGER_DEBUG=1).",
)
@click.version_option(package_name="lodger", prog_name="lodger")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """lodger: a durable agent runtime. Inspect and verify session logs.

    Global options go before the command; every command takes --state DIR (default
    .lodger, env LODGER_STATE) and most take --json.

    \b
    Exit codes:
      0    done (the turn completed)
      1    failed (the turn failed, or a provider, storage or log error)
      2    usage error (bad arguments, options or lodger.toml)
      3    blocked (resume waits for an operator decision or an invariant)
      4    not found (no such session)
      130  interrupted (Ctrl-C; 143 SIGTERM, 129 SIGHUP)

    \b
    Example:
      lodger sessions
      lodger log show SESSION --state .lodger
      lodger --debug log verify SESSION
    """
    ctx.meta["lodger.debug"] = debug  # for commands that report errors themselves
