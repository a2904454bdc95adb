"""Code mode: the ``exec`` tool and its cell substrates (DESIGN section 8).

The model writes a cell (JavaScript in a V8 isolate, or Python in the Monty interpreter)
that calls nestable tools; every nested call is durable, hidden from the model and never
re-run; the model sees the cell and its result.
"""

from lodger.substrates.codemode.limits import CellLimits, LimitName
from lodger.substrates.codemode.substrate import CellOutcome, CellSubstrate, Diagnostic
from lodger.substrates.codemode.tool import EXEC_TOOL, CodeMode, Language, exec_tool, run_cell

__all__ = [
    "EXEC_TOOL",
    "CellLimits",
    "CellOutcome",
    "CellSubstrate",
    "CodeMode",
    "Diagnostic",
    "Language",
    "LimitName",
    "exec_tool",
    "run_cell",
]
