"""Tool declarations, the registry of bound tools, and the built-in workspace tools."""

from lodger.tools.spec import (
    Accepted,
    CannotTell,
    ProbeResult,
    RecoveryPolicy,
    StillRunning,
    Tool,
    ToolContext,
    ToolOutput,
    tool,
)

__all__ = [
    "Accepted",
    "CannotTell",
    "ProbeResult",
    "RecoveryPolicy",
    "StillRunning",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "tool",
]
