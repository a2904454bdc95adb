"""Where a call's work runs: the implementations of the Executor seam (DESIGN 8).

``inprocess`` (a Python handler in this process), ``sandboxed`` (one command line in a
sandbox: ``sandbox/`` holds bubblewrap, gVisor, the egress proxy), ``codemode`` (a cell in
V8 or Monty whose nested calls go back through the pipeline), ``remote`` (work handed off
and settled later). ``select.Executors`` is the one place that picks an executor for a
tool, from its ``Tool.substrate`` declaration; each passes
``lodger.testing.executor_conformance``.
"""
