"""placeholder"""
from __future__ import annotations
class RunscSandbox:
    name = "runsc"
