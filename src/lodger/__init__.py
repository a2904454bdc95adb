"""lodger: a durable agent runtime.

An agent's history is an append-only, digest-chained log; its tools run behind a
validated, permissioned boundary that commits before and after every side effect.

    from lodger import Agent, ScriptedModel, tool

    @tool
    def add(a: int, b: int) -> int:
        "Add two integers."
        return a + b

    agent = Agent(model=ScriptedModel([{"calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
                                       {"text": "3"}]), tools=[add])
    result = await agent.run("what is 1 + 2?")
"""

from lodger.agent import Agent, SessionHandle, TurnResult
from lodger.authority import Authorities, ResourceClaim
from lodger.engine.permissions import PermissionPolicy, Rule
from lodger.errors import (
    AppendConflictError,
    AuthorityMisuseError,
    CommitFailedError,
    ConfigError,
    CorruptLogError,
    LodgerError,
    LogKeyError,
    ProviderError,
    ResumeBlockedError,
    SessionLockedError,
    SessionNotFoundError,
    StaleRevisionError,
    StorageError,
    ToolCallError,
    UsageError,
)
from lodger.events import Event
from lodger.providers import FunctionModel, ScriptedModel, make_model
from lodger.recovery import RecoveryPlan
from lodger.storage import EventLog, LogKey, open_log
from lodger.tools import ProbeResult, Tool, ToolContext, ToolOutput, tool
from lodger.tools.mcp import McpServerConfig, McpServers

__all__ = [
    "Agent",
    "AppendConflictError",
    "Authorities",
    "AuthorityMisuseError",
    "CommitFailedError",
    "ConfigError",
    "CorruptLogError",
    "Event",
    "EventLog",
    "FunctionModel",
    "LodgerError",
    "LogKey",
    "LogKeyError",
    "McpServerConfig",
    "McpServers",
    "PermissionPolicy",
    "ProbeResult",
    "ProviderError",
    "RecoveryPlan",
    "ResourceClaim",
    "ResumeBlockedError",
    "Rule",
    "ScriptedModel",
    "SessionHandle",
    "SessionLockedError",
    "SessionNotFoundError",
    "StaleRevisionError",
    "StorageError",
    "Tool",
    "ToolCallError",
    "ToolContext",
    "ToolOutput",
    "TurnResult",
    "UsageError",
    "make_model",
    "open_log",
    "tool",
]
