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

import typing as _typing

from lodger._core import lazy as _lazy

if _typing.TYPE_CHECKING:
    from lodger.authority import Authorities, ResourceClaim
    from lodger.engine.budgets import Budgets, UsageLimits
    from lodger.engine.compaction import CompactionPolicy
    from lodger.engine.hooks import AfterCall, BeforeCall, CallInfo, CallResult, Rewrite, Veto
    from lodger.engine.prices import ModelPrice, PriceTable
    from lodger.engine.settings import Hooks, Limits, Retries, Services
    from lodger.errors import (
        AppendConflictError,
        AuthorityMisuseError,
        CommitFailedError,
        ConfigError,
        CorruptLogError,
        HookError,
        LodgerError,
        LogKeyError,
        MissingExtraError,
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
    from lodger.media import BinaryContent, DocumentUrl, ImageUrl, MediaLimits
    from lodger.providers import (
        AssistantMessage,
        FallbackModel,
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
    from lodger.providers.base import ModelSettings
    from lodger.recovery import RecoveryPlan
    from lodger.runtime.agent import Agent, RunUsage, SessionHandle, TurnResult
    from lodger.runtime.streaming import (
        FactCommitted,
        StreamItem,
        TextDelta,
        TurnFinished,
        TurnStream,
    )
    from lodger.storage import EventLog, LogKey, Storage, open_log
    from lodger.tools import ProbeResult, Tool, ToolContext, ToolOutput, tool
    from lodger.tools.mcp import McpOAuth, McpServerConfig, McpServers
    from lodger.tools.policy import PermissionPolicy, Rule

# name -> the module it comes from: imported on first use, so `import lodger` (and the
# command line, which imports it) stays cheap; type checkers read the imports above.
_EXPORTS: dict[str, str] = {
    "Agent": "lodger.runtime.agent",
    "RunUsage": "lodger.runtime.agent",
    "SessionHandle": "lodger.runtime.agent",
    "TurnResult": "lodger.runtime.agent",
    "Authorities": "lodger.authority",
    "ResourceClaim": "lodger.authority",
    "AfterCall": "lodger.engine.hooks",
    "BeforeCall": "lodger.engine.hooks",
    "CallInfo": "lodger.engine.hooks",
    "CallResult": "lodger.engine.hooks",
    "Rewrite": "lodger.engine.hooks",
    "Veto": "lodger.engine.hooks",
    "Hooks": "lodger.engine.settings",
    "Limits": "lodger.engine.settings",
    "Budgets": "lodger.engine.budgets",
    "CompactionPolicy": "lodger.engine.compaction",
    "UsageLimits": "lodger.engine.budgets",
    "ModelPrice": "lodger.engine.prices",
    "PriceTable": "lodger.engine.prices",
    "Retries": "lodger.engine.settings",
    "Services": "lodger.engine.settings",
    "AppendConflictError": "lodger.errors",
    "AuthorityMisuseError": "lodger.errors",
    "CommitFailedError": "lodger.errors",
    "ConfigError": "lodger.errors",
    "CorruptLogError": "lodger.errors",
    "LodgerError": "lodger.errors",
    "LogKeyError": "lodger.errors",
    "MissingExtraError": "lodger.errors",
    "ProviderError": "lodger.errors",
    "ResumeBlockedError": "lodger.errors",
    "SessionLockedError": "lodger.errors",
    "SessionNotFoundError": "lodger.errors",
    "StaleRevisionError": "lodger.errors",
    "StorageError": "lodger.errors",
    "ToolCallError": "lodger.errors",
    "UsageError": "lodger.errors",
    "HookError": "lodger.errors",
    "Event": "lodger.events",
    "ProposedCall": "lodger.events",
    "Usage": "lodger.events",
    "BinaryContent": "lodger.media",
    "DocumentUrl": "lodger.media",
    "ImageUrl": "lodger.media",
    "MediaLimits": "lodger.media",
    "AssistantMessage": "lodger.providers",
    "FallbackModel": "lodger.providers",
    "FunctionModel": "lodger.providers",
    "Message": "lodger.providers",
    "Model": "lodger.providers",
    "ModelRequest": "lodger.providers",
    "ModelResponse": "lodger.providers",
    "ScriptedModel": "lodger.providers",
    "TestModel": "lodger.providers",
    "ToolResultMessage": "lodger.providers",
    "ToolSchema": "lodger.providers",
    "UserMessage": "lodger.providers",
    "make_model": "lodger.providers",
    "ModelSettings": "lodger.providers.base",
    "tool_call": "lodger.providers",
    "RecoveryPlan": "lodger.recovery",
    "EventLog": "lodger.storage",
    "LogKey": "lodger.storage",
    "Storage": "lodger.storage",
    "open_log": "lodger.storage",
    "FactCommitted": "lodger.runtime.streaming",
    "StreamItem": "lodger.runtime.streaming",
    "TextDelta": "lodger.runtime.streaming",
    "TurnFinished": "lodger.runtime.streaming",
    "TurnStream": "lodger.runtime.streaming",
    "ProbeResult": "lodger.tools",
    "Tool": "lodger.tools",
    "ToolContext": "lodger.tools",
    "ToolOutput": "lodger.tools",
    "tool": "lodger.tools",
    "McpOAuth": "lodger.tools.mcp",
    "McpServerConfig": "lodger.tools.mcp",
    "McpServers": "lodger.tools.mcp",
    "PermissionPolicy": "lodger.tools.policy",
    "Rule": "lodger.tools.policy",
}

__all__ = [
    "AfterCall",
    "Agent",
    "AppendConflictError",
    "AssistantMessage",
    "Authorities",
    "AuthorityMisuseError",
    "BeforeCall",
    "BinaryContent",
    "Budgets",
    "CallInfo",
    "CallResult",
    "CommitFailedError",
    "CompactionPolicy",
    "ConfigError",
    "CorruptLogError",
    "DocumentUrl",
    "Event",
    "EventLog",
    "FactCommitted",
    "FallbackModel",
    "FunctionModel",
    "HookError",
    "Hooks",
    "ImageUrl",
    "Limits",
    "LodgerError",
    "LogKey",
    "LogKeyError",
    "McpOAuth",
    "McpServerConfig",
    "McpServers",
    "MediaLimits",
    "Message",
    "MissingExtraError",
    "Model",
    "ModelPrice",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "PermissionPolicy",
    "PriceTable",
    "ProbeResult",
    "ProposedCall",
    "ProviderError",
    "RecoveryPlan",
    "ResourceClaim",
    "ResumeBlockedError",
    "Retries",
    "Rewrite",
    "Rule",
    "RunUsage",
    "ScriptedModel",
    "Services",
    "SessionHandle",
    "SessionLockedError",
    "SessionNotFoundError",
    "StaleRevisionError",
    "Storage",
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
    "UsageLimits",
    "UserMessage",
    "Veto",
    "make_model",
    "open_log",
    "tool",
    "tool_call",
]


def __getattr__(name: str) -> _typing.Any:
    return _lazy.resolve(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
