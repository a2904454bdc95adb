"""Tool declarations, the registry of bound tools, and the built-in workspace tools."""

from lodger.tools.spec import ProbeResult, RecoveryPolicy, Tool, ToolContext, ToolOutput, tool

__all__ = ["ProbeResult", "RecoveryPolicy", "Tool", "ToolContext", "ToolOutput", "tool"]
