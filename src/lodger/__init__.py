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
    result = await agent.run("what is 1 + 2?")      # or agent.run_sync(...)

Structured output (``output_type=``), typed deps (``deps=``, ``ToolContext[Deps]``),
streaming (``agent.stream``), before/after call hooks (``Veto``, ``Rewrite``) and a
``TestModel`` that needs no script: see ``examples/``.
"""

from lodger.agent import Agent, RunUsage, SessionHandle, TurnResult
from lodger.authority import Authorities, ResourceClaim
from lodger.engine.hooks import AfterCall, BeforeCall, CallInfo, CallResult, Rewrite, Veto
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
from lodger.events import Event, ProposedCall, Usage
from lodger.providers import (
    AssistantMessage,
    FunctionModel,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    TestModel,
    ToolResultMessage,
    ToolSchema,
    UserMessage,
    make_model,
    tool_call,
)
from lodger.recovery import RecoveryPlan
from lodger.storage import EventLog, LogKey, open_log
from lodger.streaming import FactCommitted, StreamItem, TextDelta, TurnFinished, TurnStream
from lodger.tools import ProbeResult, Tool, ToolContext, ToolOutput, tool
from lodger.tools.mcp import McpServerConfig, McpServers

__all__ = [
    "AfterCall",
    "Agent",
    "AppendConflictError",
    "AssistantMessage",
    "Authorities",
    "AuthorityMisuseError",
    "BeforeCall",
    "CallInfo",
    "CallResult",
    "CommitFailedError",
    "ConfigError",
    "CorruptLogError",
    "Event",
    "EventLog",
    "FactCommitted",
    "FunctionModel",
    "LodgerError",
    "LogKey",
    "LogKeyError",
    "McpServerConfig",
    "McpServers",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "PermissionPolicy",
    "ProbeResult",
    "ProposedCall",
    "ProviderError",
    "RecoveryPlan",
    "ResourceClaim",
    "ResumeBlockedError",
    "Rewrite",
    "Rule",
    "RunUsage",
    "ScriptedModel",
    "SessionHandle",
    "SessionLockedError",
    "SessionNotFoundError",
    "StaleRevisionError",
    "StorageError",
    "StreamItem",
    "TestModel",
    "TextDelta",
    "Tool",
    "ToolCallError",
    "ToolContext",
    "ToolOutput",
    "ToolResultMessage",
    "ToolSchema",
    "TurnFinished",
    "TurnResult",
    "TurnStream",
    "Usage",
    "UsageError",
    "UserMessage",
    "Veto",
    "make_model",
    "open_log",
    "tool",
    "tool_call",
]
