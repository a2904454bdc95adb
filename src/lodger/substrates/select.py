"""Which Executor runs a call: chosen per tool, here and nowhere else (DESIGN section 8).

A tool declares where its calls run (``Tool.substrate``); the pipeline asks ``Executors``
for the executor of that declaration, as an HTTP client picks the transport mounted for a
URL:

    substrate          declared by                       executor
    None               every plain tool                  InProcessExecutor
    sandboxed_process  shell, run_python                 SandboxExecutor (substrates.sandboxed)
    code_cell          exec                              CellExecutor (substrates.codemode.executor)
    remote             delegate with a child launcher    RemoteExecutor (substrates.remote)

A kind can be mounted on another executor (a microVM for sandboxed processes, a fake in
a test); otherwise a declaration brings the executor that serves it, so the engine
imports no particular substrate.

>>> executors = Executors(mounts={"sandboxed_process": MicroVmExecutor()})
>>> executors.for_tool(shell)  # the microVM, for every sandboxed tool of the run
"""

from __future__ import annotations

from collections.abc import Mapping

from lodger.substrates.inprocess import InProcessExecutor
from lodger.tools.spec import Executor, SubstrateKind, Tool

__all__ = ["Executors"]


class Executors:
    """The executors of one pipeline: the in-process one, and any mounted per kind."""

    __slots__ = ("_mounts", "in_process")

    def __init__(
        self,
        *,
        in_process: Executor | None = None,
        mounts: Mapping[SubstrateKind, Executor] | None = None,
    ) -> None:
        self._mounts: dict[SubstrateKind, Executor] = dict(mounts or {})
        if in_process is not None:
            self._mounts["in_process"] = in_process
        #: what runs the calls of a tool that declares no substrate (most of them)
        self.in_process: Executor = self._mounts.setdefault("in_process", InProcessExecutor())

    def for_tool(self, t: Tool) -> Executor:
        """The executor that runs ``t``'s calls."""
        substrate = t.substrate
        if substrate is None:
            return self.in_process
        return self._mounts.get(substrate.kind) or substrate.executor
