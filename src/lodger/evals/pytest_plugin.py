"""A pytest plugin that runs eval files as tests: one test per case.

Turn it on with ``pytest -p lodger.evals.pytest_plugin`` (or ``pytest_plugins =
["lodger.evals.pytest_plugin"]`` in a ``conftest.py``). It collects files named
``eval_*.py`` or ``*_eval.py``; each of their ``EvalSuite`` objects runs once (with its
bounded concurrency) when its first case's test runs, and each case's test passes when
all of its assertions held and no score fell below the suite's ``min_score``. A failure
lists each grader that failed and why, and names the case's session.

The sessions go where ``lodger eval`` would put them: ``--lodger-state DIR`` (default
``$LODGER_STATE`` or ``.lodger``), or the object store ``$LODGER_STORE`` names.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lodger.evals.loading import load_suites
from lodger.evals.suite import CaseResult, EvalRun, EvalSuite, run_suite

__all__ = ["EvalCaseFailed", "pytest_addoption", "pytest_collect_file"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lodger-state",
        default=None,
        metavar="DIR",
        help="state directory the eval cases' sessions go to (default: $LODGER_STATE or .lodger)",
    )


def _is_eval_file(path: Path) -> bool:
    return path.suffix == ".py" and (path.name.startswith("eval_") or path.stem.endswith("_eval"))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if _is_eval_file(file_path):
        return EvalFile.from_parent(parent, path=file_path)
    return None


class EvalCaseFailed(AssertionError):
    """A case's graders did not all pass."""

    def __init__(self, case: CaseResult, run: EvalRun) -> None:
        self.case = case
        lines = [f"eval case {case.name!r} of suite {run.suite!r} failed (model {run.model})"]
        if case.error:
            lines.append(f"  error: {case.error}")
        for name, (ok, reason) in case.assertions.items():
            if not ok:
                lines.append(f"  {name}: failed" + (f": {reason}" if reason else ""))
        for name, (value, reason) in case.scores.items():
            if run.min_score is not None and value < run.min_score:
                lines.append(
                    f"  {name}: {value:.2f} < {run.min_score}" + (f": {reason}" if reason else "")
                )
        lines.append(f"  answer: {case.output!r}")
        lines.append(f"  session: {case.session_id} (eval run {run.eval_run})")
        super().__init__("\n".join(lines))


class _SuiteRun:
    """A suite, run once for all its cases' tests."""

    def __init__(self, suite: EvalSuite, state: str) -> None:
        self.suite = suite
        self.state = state
        self._run: EvalRun | None = None

    def result(self) -> EvalRun:
        if self._run is None:
            self._run = asyncio.run(self._go())
        return self._run

    async def _go(self) -> EvalRun:
        from lodger.runtime.sessions import Sessions
        from lodger.storage import Storage

        async with Sessions(Storage.open(self.state)) as sessions:
            return await run_suite(self.suite, sessions)


class EvalFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        option = self.config.getoption("--lodger-state")
        state = option or os.environ.get("LODGER_STATE") or ".lodger"
        for suite in load_suites(self.path):
            run = _SuiteRun(suite, state)
            for case in suite.dataset.cases:
                yield EvalCase.from_parent(
                    self, name=f"{suite.name}[{case.name}]", run=run, case=case.name
                )


class EvalCase(pytest.Item):
    def __init__(self, *, run: _SuiteRun, case: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.case = case

    def runtest(self) -> None:
        done = self.run.result()
        case = done.case(str(self.case))
        if not case.passed(done.min_score):
            raise EvalCaseFailed(case, done)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        if isinstance(excinfo.value, EvalCaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name
