"""Evals: cases run as lodger turns, graded, kept, and compared (``pip install 'lodger[evals]'``).

Built on pydantic-evals: a suite's cases are a pydantic-evals ``Dataset`` (``Case`` with
inputs, an expected output, graders), its graders are pydantic-evals evaluators (lodger's
read the case's calls too: ``ToolCalled``; ``ModelJudge`` asks a lodger model), and its
report is pydantic-evals' ``EvaluationReport``. What lodger adds is where the cases run:
each on a session of its own (or a copy-free fork of a starting session), with bounded
concurrency, the verdicts kept as ``eval_scored`` facts on the sessions and in a JSON
report, and two reports compared side by side.

An eval file is a Python file that defines ``EvalSuite`` objects at module level;
``lodger eval FILE`` runs them, and so does pytest with the plugin
(``pytest -p lodger.evals.pytest_plugin eval_support.py``: one test per case)::

    from lodger.evals import Case, Contains, Dataset, EvalSuite, ToolCalled
    from lodger.runtime.sessions import Binding

    suite = EvalSuite(
        name="support",
        dataset=Dataset(name="support", cases=[
            Case(name="refund", inputs="Can I get a refund?", evaluators=[Contains("30 days")]),
        ]),
        binding=Binding(model="openai:gpt-4.1", tools=tools),
    )
"""

from __future__ import annotations

from lodger._core.extras import require

with require("evals", "lodger's evals"):
    from pydantic_evals import Case, Dataset

from lodger.evals.graders import (
    Check,
    Contains,
    Equals,
    EqualsExpected,
    MatchesSchema,
    ModelJudge,
    ToolCalled,
    calls_of,
)
from lodger.evals.loading import load_suites
from lodger.evals.suite import CaseResult, EvalRun, EvalSuite, Start, compare_runs, run_suite

__all__ = [
    "Case",
    "CaseResult",
    "Check",
    "Contains",
    "Dataset",
    "Equals",
    "EqualsExpected",
    "EvalRun",
    "EvalSuite",
    "MatchesSchema",
    "ModelJudge",
    "Start",
    "ToolCalled",
    "calls_of",
    "compare_runs",
    "load_suites",
    "run_suite",
]
