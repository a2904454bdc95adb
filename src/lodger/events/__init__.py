"""Event kinds, their canonical encoding, and the digest chain (DESIGN section 3).

An event is one immutable fact. Its envelope says where it sits (session, offset, turn,
run, step, call) and its ``body`` says what happened; ``body.kind`` is the discriminator.
Every model is frozen, keyword-only and closed: an unknown kind or field fails decoding.

Canonical bytes are compact JSON with sorted keys, UTF-8, no NaN. The digest chain is

    digest_n = sha256(DIGEST_DOMAIN || bytes(digest_{n-1}) || canonical_bytes(event_n))

with an empty previous digest for offset 0. ``digest`` itself is not part of the bytes.
A keyed chain (DESIGN L10) takes the same input under HMAC-SHA256 with a secret key and
its own domain tag, so a plain and a keyed digest never collide:

    digest_n = hmac_sha256(key, HMAC_DIGEST_DOMAIN || bytes(digest_{n-1}) || canonical_bytes)

A session's ``session_started`` event (offset 0) names its chain and key id; the digest
of offset 0 covers that claim, so it cannot change without the chain breaking.

Schema changelog (bump ``SCHEMA_VERSION`` and add one line per change; golden logs in
``tests/data/golden`` must stay readable):

    1  first event set.
    2  model_output.provider_state: opaque provider data replayed to the same provider.
    3  tool_responded.status timed_out; session_started.chain and key_id.
    4  run_started.workspace and workspace_id (a relocating resume); turn_ended.reason.
    5  output_rejected; turn_ended.output (structured output); call_rejected reason vetoed.
    6  permission_decided.decision park (the call waits for an answer given outside the run).
    7  permission_decided.who and operator_decision.who (who decided).
    8  usage cache tokens; step settings; turn attachments; model_switched; budget_reached.
    9  compaction; steering and a follow-up queue; cancel; modes; rewind; background work.
    10  MCP elicitation, sampling and tool-list changes; replay and eval facts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from lodger.errors import CorruptLogError, UsageError
from lodger.events.encoding import compile_model_encoder, tree_encoder

__all__ = [
    "ALWAYS_REASON",
    "DIGEST_DOMAIN",
    "EMPTY_PREFIX",
    "HMAC_DIGEST_DOMAIN",
    "SCHEMA_CHANGELOG",
    "SCHEMA_VERSION",
    "ArtifactRef",
    "ArtifactStored",
    "Attachment",
    "Body",
    "BudgetReached",
    "CallAccepted",
    "CallRejected",
    "CallReplayed",
    "CancelRequested",
    "ChainKind",
    "Compacted",
    "CompactionFailed",
    "CompactionTrigger",
    "ContextCompacted",
    "DecisionAction",
    "ElicitationAnswered",
    "ElicitationRequested",
    "EvalScored",
    "Event",
    "EventDraft",
    "FileCheckpoint",
    "FileExpectation",
    "ForkParent",
    "MessageQueued",
    "ModelOutput",
    "ModelSwitched",
    "ObservedReason",
    "ObservedStatus",
    "OperatorDecision",
    "OutputRejected",
    "PermissionDecided",
    "PermissionMode",
    "PermissionModeChanged",
    "PermissionRequested",
    "Prefix",
    "ProcessEnded",
    "ProcessStarted",
    "ProposedCall",
    "ProviderRetried",
    "QueueChanged",
    "QueuePolicy",
    "RecoveryAction",
    "RecoveryDecided",
    "RecoveryObserved",
    "RecoveryPolicy",
    "RejectionReason",
    "ReplayStarted",
    "ResultStatus",
    "Rewound",
    "RunEnded",
    "RunStarted",
    "SamplingAnswered",
    "SamplingRequested",
    "SessionStarted",
    "SteerDelivered",
    "SteerReceived",
    "StepStarted",
    "ToolDispatched",
    "ToolRef",
    "ToolResponded",
    "ToolsActivated",
    "ToolsChanged",
    "TurnEnded",
    "TurnStarted",
    "Usage",
    "WorkspaceSnapshot",
    "canonical_bytes",
    "canonical_json",
    "chain_digest",
    "claimed_chain",
    "decode_event",
    "keyed_chain_digest",
    "new_draft",
    "seal",
]

SCHEMA_VERSION = 10
SCHEMA_CHANGELOG: Mapping[int, str] = {
    1: "first event set",
    2: "model_output.provider_state: opaque provider data replayed to the same provider",
    3: "tool_responded.status timed_out; session_started.chain and key_id",
    4: "run_started.workspace and workspace_id (a relocating resume); turn_ended.reason",
    5: "output_rejected; turn_ended.output (structured output); call_rejected reason vetoed",
    6: "permission_decided.decision park (the call waits for an answer given outside the run)",
    7: "permission_decided.who and operator_decision.who (who decided)",
    8: "usage cache tokens; step settings; turn attachments; model_switched; budget_reached",
    9: "compaction; steering and a follow-up queue; cancel; modes; rewind; background work",
    10: "MCP elicitation, sampling and tool-list changes; replay and eval facts",
}
DIGEST_DOMAIN = b"lodger/event-chain/v1\n"
HMAC_DIGEST_DOMAIN = b"lodger/event-chain/hmac/v1\n"

_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True)


class _Value(BaseModel):
    model_config = _CONFIG


# ---------------------------------------------------------------- shared values


class Prefix(_Value):
    """A verified prefix ``[0, high_water)`` and the digest of its last event."""

    high_water: int
    digest: str


EMPTY_PREFIX = Prefix(high_water=0, digest="")
"""The prefix of a log that has no events yet."""


class ForkParent(_Value):
    session_id: str
    high_water: int
    digest: str


class ToolRef(_Value):
    """A tool visible in a step: its name and the digest of the schema the model saw."""

    name: str
    schema_digest: str


class ProposedCall(_Value):
    """A call as the model emitted it; ``arguments`` is the raw JSON text, kept verbatim."""

    call_id: str
    name: str
    arguments: str


class Usage(_Value):
    """Tokens one model request used. ``input_tokens`` counts every input token, cached or
    not; ``cache_read_tokens`` of them were read from the provider's prompt cache and
    ``cache_write_tokens`` were written to it (schema 8; 0 in older logs and where the
    provider does not say)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class ArtifactRef(_Value):
    sha256: str
    size: int
    media_type: str = "text/plain"


class Attachment(_Value):
    """An image or document given with a turn's input (schema 8): its bytes are an
    artifact, or it is a URL the provider fetches itself (never fetched by lodger)."""

    media_type: str
    artifact: ArtifactRef | None = None
    url: str | None = None
    name: str = ""


class FileExpectation(_Value):
    """What a file write expects: the hash before (None: absent) and after."""

    path: str
    before_sha256: str | None
    after_sha256: str | None


ResultStatus = Literal["ok", "error", "denied", "cancelled", "interrupted", "timed_out"]
# ``report``: never run again; recovery settles it as interrupted and tells the model
# (code cells: their nested calls are the durable record of what they did)
RecoveryPolicy = Literal["idempotent", "queryable", "never_retry", "report"]
RejectionReason = Literal[
    "unbound",
    "invisible",
    "activated_this_step",
    "invalid_arguments",
    "duplicate_call",
    "claims_failed",
    "denied",
    "precondition",
    "vetoed",
]
ObservedStatus = Literal["completed", "not_applied", "unknown", "interrupted"]
ObservedReason = Literal[
    "not_dispatched",
    "probe_applied",
    "probe_not_applied",
    "probe_unknown",
    "cell_interrupted",
]
RecoveryAction = Literal["park"]
DecisionAction = Literal["completed", "not_applied", "abandon"]
Origin = Literal["provider", "code_mode", "runtime", "operator"]
ChainKind = Literal["sha256", "hmac-sha256"]
Visibility = Literal["model", "hidden"]


# ---------------------------------------------------------------- bodies


class SessionStarted(_Value):
    """The first event of a session. ``chain`` and ``key_id`` are filled in by the log
    that writes it (its key decides), never by the caller; logs older than schema 3
    decode as ``sha256``."""

    kind: Literal["session_started"] = "session_started"
    workspace: str | None = None
    workspace_id: str | None = None
    parent: ForkParent | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    chain: ChainKind = "sha256"
    #: hex of the first 8 bytes of sha256(key) for a keyed chain, so a wrong key is named
    key_id: str | None = None


class TurnStarted(_Value):
    kind: Literal["turn_started"] = "turn_started"
    input: str
    #: images and documents given with the input (schema 8)
    attachments: tuple[Attachment, ...] = ()


class RunStarted(_Value):
    """A run of a turn begins. ``workspace`` and ``workspace_id`` are set only when the
    run moved the session to another workspace (a resume that relocated it after checking
    the files the log's hashes cover); from then on the session works there."""

    kind: Literal["run_started"] = "run_started"
    protocol: int = SCHEMA_VERSION
    model: str
    parent_run_id: str | None = None
    resumed_from: Prefix | None = None
    tools: tuple[str, ...] = ()
    workspace: str | None = None
    workspace_id: str | None = None


class StepStarted(_Value):
    """A step begins. ``settings`` are the model settings the step's request asked for
    (temperature, max tokens...; only those set), so a replay knows what was asked
    (schema 8; None in older logs and when nothing was set)."""

    kind: Literal["step_started"] = "step_started"
    index: int
    model: str
    tools: tuple[ToolRef, ...]
    settings: dict[str, JsonValue] | None = None


class ModelOutput(_Value):
    kind: Literal["model_output"] = "model_output"
    text: str = ""
    reasoning: str = ""
    calls: tuple[ProposedCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    # What a provider needs back verbatim in later requests and nobody else reads:
    # Anthropic's signed thinking blocks, for example. Keyed by provider.
    provider_state: dict[str, JsonValue] | None = None


class ProviderRetried(_Value):
    kind: Literal["provider_retried"] = "provider_retried"
    attempt: int
    error: str
    delay_ms: int


class ModelSwitched(_Value):
    """A fallback model took over a step because ``from_model`` failed in a way that is
    not the request's fault (``error`` says how); the step's output is ``to_model``'s
    (schema 8)."""

    kind: Literal["model_switched"] = "model_switched"
    from_model: str
    to_model: str
    error: str


class BudgetReached(_Value):
    """A usage limit or a spend budget was reached before the next model request: the run
    parks (``run_ended`` parked) and the turn stays open until the limit is raised and the
    session resumed (schema 8). ``budget`` names it (``requests``, ``input_tokens``,
    ``output_tokens``, ``total_tokens``, ``tool_calls``, ``session_cost``, ``tree_cost``,
    ``daily_cost``); ``unit`` is ``requests``, ``tokens``, ``calls``, or ``micro_`` and a
    currency code for money (``micro_usd``: amounts in millionths, exact integers);
    ``scope`` is what it counts over (``turn``, ``session``, ``tree``, ``day``)."""

    kind: Literal["budget_reached"] = "budget_reached"
    budget: str
    limit: int
    spent: int
    unit: str
    scope: str = "turn"


class CallRejected(_Value):
    """A call refused before dispatch; ``reason`` is a stable code."""

    kind: Literal["call_rejected"] = "call_rejected"
    tool: str
    reason: str  # a RejectionReason; golden v1 logs hold older free-form codes
    message: str


class PermissionRequested(_Value):
    kind: Literal["permission_requested"] = "permission_requested"
    tool: str
    summary: str


class PermissionDecided(_Value):
    kind: Literal["permission_decided"] = "permission_decided"
    tool: str
    #: ``park``: not dispatched; the call waits for an answer given outside the run (an
    #: approval in the control plane) and a resume asks the approver again
    decision: Literal["allow", "deny", "park"]
    by: Literal["policy", "user", "operator", "default"]
    reason: str = ""
    #: who decided (schema 7; None in older logs and where nobody did, as a default
    #: denial): ``token:tok_...`` (a host token's public id, never the token),
    #: ``cli:<user>`` (the terminal's OS user), ``rule 'shell(rm *)'`` (the policy)
    who: str | None = None


class ToolDispatched(_Value):
    """T1: every check passed and the side effect may start."""

    kind: Literal["tool_dispatched"] = "tool_dispatched"
    operation_id: str
    tool: str
    arguments: dict[str, JsonValue]
    attempt: int = 1
    retry_of: str | None = None
    recovery: str = "never_retry"  # a RecoveryPolicy; v1 logs hold older names
    resources: tuple[str, ...] = ()
    expectations: tuple[FileExpectation, ...] = ()


class ToolResponded(_Value):
    """T2: the outcome is durable and may now reach the model."""

    kind: Literal["tool_responded"] = "tool_responded"
    operation_id: str
    status: ResultStatus
    content: str
    truncated: bool = False
    artifacts: tuple[ArtifactRef, ...] = ()


class ToolsActivated(_Value):
    kind: Literal["tools_activated"] = "tools_activated"
    query: str
    names: tuple[str, ...]


class RecoveryObserved(_Value):
    kind: Literal["recovery_observed"] = "recovery_observed"
    operation_id: str
    status: str  # an ObservedStatus (v1 logs: free-form)
    reason: str  # an ObservedReason (v1 logs: free-form)
    observation: str = ""


class RecoveryDecided(_Value):
    kind: Literal["recovery_decided"] = "recovery_decided"
    operation_id: str
    action: str  # a RecoveryAction (v1 logs: free-form)
    reason: str = ""


class OperatorDecision(_Value):
    kind: Literal["operator_decision"] = "operator_decision"
    operation_id: str
    decision: DecisionAction
    result: str | None = None
    by: str = "operator"
    #: who decided, as ``permission_decided.who`` says (schema 7; None in older logs)
    who: str | None = None


class ArtifactStored(_Value):
    kind: Literal["artifact_stored"] = "artifact_stored"
    artifact: ArtifactRef
    name: str = ""


class WorkspaceSnapshot(_Value):
    kind: Literal["workspace_snapshot"] = "workspace_snapshot"
    ref: str
    files: int
    size: int


class ContextCompacted(_Value):
    kind: Literal["context_compacted"] = "context_compacted"
    elided_call_ids: tuple[str, ...]
    budget_tokens: int
    estimated_tokens: int


CompactionTrigger = Literal["manual", "threshold", "overflow", "context_error"]


class Compacted(_Value):
    """A compaction (schema 9): a projection of the log up to ``covers``, never a rewrite.

    The model's context after it is the system prompt, what was pinned, ``summary`` (or
    the provider's ``native_state`` where one is used) and every fact after
    ``covers.high_water``. ``previous`` is the offset of the compaction this one chains
    from (its summary is part of what this one covers); ``dropped_*`` say what the
    summary stands for; ``model`` and ``prompt_sha256`` say what made it, and ``usage``
    what its summary requests spent (every attempt; budgets count it).
    """

    kind: Literal["compacted"] = "compacted"
    covers: Prefix
    summary: str
    native_state: dict[str, JsonValue] | None = None
    dropped_call_ids: tuple[str, ...] = ()
    dropped_bytes: int = 0
    dropped_tokens: int = 0
    pinned: tuple[str, ...] = ()
    model: str
    prompt_sha256: str
    tokens_before: int
    tokens_after: int
    trigger: CompactionTrigger
    previous: int | None = None
    usage: Usage | None = None


class CompactionFailed(_Value):
    """A compaction that did not produce a usable summary (schema 9): ``fallback`` says
    what the step did instead (``elision``: the oldest tool results were elided);
    ``model`` and ``usage``: what the attempts asked and spent."""

    kind: Literal["compaction_failed"] = "compaction_failed"
    covers: Prefix
    trigger: CompactionTrigger
    attempts: int
    reason: str
    fallback: Literal["elision", "none"] = "elision"
    model: str = ""
    usage: Usage | None = None


class SteerReceived(_Value):
    """A message for the running turn (schema 9), committed when it arrives; the model
    reads it at the next provider boundary (``steer_delivered``)."""

    kind: Literal["steer_received"] = "steer_received"
    steer_id: str
    text: str
    who: str | None = None


class SteerDelivered(_Value):
    """The steers first carried by step ``step``'s request (schema 9), in order."""

    kind: Literal["steer_delivered"] = "steer_delivered"
    steer_ids: tuple[str, ...]
    step: int


QueuePolicy = Literal["enqueue", "reject", "interrupt", "rollback"]


class MessageQueued(_Value):
    """A follow-up message queued for a later turn (schema 9), with its policy."""

    kind: Literal["message_queued"] = "message_queued"
    message_id: str
    text: str
    policy: QueuePolicy = "enqueue"
    who: str | None = None


class QueueChanged(_Value):
    """A change to a queued message before delivery (schema 9): ``edit`` (new ``text``),
    ``move`` (to ``position``), ``retract``, or ``delivered`` (it became the next turn)."""

    kind: Literal["queue_changed"] = "queue_changed"
    message_id: str
    action: Literal["edit", "move", "retract", "delivered"]
    text: str | None = None
    position: int | None = None
    who: str | None = None


class CancelRequested(_Value):
    """Someone asked the running turn to stop (schema 9): queued calls never start,
    calls past T1 settle, and the turn ends ``cancelled``."""

    kind: Literal["cancel_requested"] = "cancel_requested"
    who: str | None = None
    reason: str = ""


PermissionMode = Literal["plan", "ask", "accept_edits", "full_auto"]


class PermissionModeChanged(_Value):
    """The session's permission mode from the next step on (schema 9); the project's
    deny rules hold in every mode."""

    kind: Literal["permission_mode_changed"] = "permission_mode_changed"
    mode: PermissionMode
    previous: PermissionMode | None = None
    who: str | None = None


class Rewound(_Value):
    """This branch became the session's current one by a rewind (schema 9): ``left`` is
    the branch left behind at its head (rewinding to it undoes this one), ``to`` the
    prefix this branch starts from; ``restored``/``removed`` count workspace files put
    back, ``forced`` names files changed outside lodger that were overwritten."""

    kind: Literal["rewound"] = "rewound"
    left: ForkParent
    to: Prefix
    restored: int = 0
    removed: int = 0
    forced: tuple[str, ...] = ()
    who: str | None = None


class FileCheckpoint(_Value):
    """A file tool's per-edit checkpoint (schema 9): the content ``path`` had before the
    edit (``before``: an artifact; None with ``before_sha256`` None: absent), so a rewind
    into the middle of a turn restores exactly."""

    kind: Literal["file_checkpoint"] = "file_checkpoint"
    operation_id: str
    path: str
    before_sha256: str | None
    after_sha256: str | None
    before: ArtifactRef | None = None


class ProcessStarted(_Value):
    """A background process started by the call ``operation_id`` (schema 9): it outlives
    the call in the session's sandbox until it exits or is stopped; ``keep`` says whether
    it stops with the turn (``turn``) or may live for the session (``session``)."""

    kind: Literal["process_started"] = "process_started"
    process_id: str
    operation_id: str
    command: str
    pid: int | None = None
    sandbox: str = ""
    keep: Literal["turn", "session"] = "turn"


class ProcessEnded(_Value):
    """A background process's end (schema 9): ``unknown`` when a resume found it gone
    and no one saw it end; ``limit`` names the limit that stopped it in ``reason``."""

    kind: Literal["process_ended"] = "process_ended"
    process_id: str
    status: Literal["exited", "stopped", "killed", "limit", "unknown"]
    exit_code: int | None = None
    reason: str = ""
    output_bytes: int = 0


class CallAccepted(_Value):
    """A long-running call the remote side accepted (schema 9): the call is running with
    ``handle`` (a job or task id: what recovery queries); its ``tool_responded`` comes
    when the result arrives, possibly in a later turn."""

    kind: Literal["call_accepted"] = "call_accepted"
    operation_id: str
    handle: dict[str, JsonValue]
    wait: Literal["continue", "wait"] = "continue"


class ElicitationRequested(_Value):
    """An MCP server asked the user a question while the call ``operation_id`` ran
    (schema 10): ``form`` asks for values matching ``requested_schema``; ``url`` sends a
    person to ``url`` (to authorize, say) and asks for no values. The call waits for an
    ``elicitation_answered`` with the same ``elicitation_id``."""

    kind: Literal["elicitation_requested"] = "elicitation_requested"
    elicitation_id: str
    operation_id: str
    server: str
    mode: Literal["form", "url"]
    message: str
    requested_schema: dict[str, JsonValue] = Field(default_factory=dict)
    url: str | None = None


class ElicitationAnswered(_Value):
    """The answer to an elicitation (schema 10), as the server received it, except the
    values of the fields named in ``withheld`` (the schema marked them sensitive): those
    went to the server and never to the log. ``by`` says who answered: a person at a
    prompt or through the API (``user``, ``operator``), a rule (``policy``), or nobody in
    time (``timeout``); ``who`` as ``permission_decided.who`` says."""

    kind: Literal["elicitation_answered"] = "elicitation_answered"
    elicitation_id: str
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, JsonValue] = Field(default_factory=dict)
    withheld: tuple[str, ...] = ()
    by: Literal["user", "operator", "policy", "timeout"] = "user"
    who: str | None = None


class SamplingRequested(_Value):
    """An MCP server asked for a model completion while the call ``operation_id`` ran
    (schema 10): ``request`` is what it sent (messages, system prompt, limits);
    ``decision`` is the policy's, before any model is asked."""

    kind: Literal["sampling_requested"] = "sampling_requested"
    sampling_id: str
    operation_id: str
    server: str
    request: dict[str, JsonValue]
    decision: Literal["allow", "deny"]
    reason: str = ""


class SamplingAnswered(_Value):
    """The session's own model answered an allowed sampling request (schema 10); its
    ``usage`` counts in the session's budgets."""

    kind: Literal["sampling_answered"] = "sampling_answered"
    sampling_id: str
    model: str
    content: str
    stop_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)


class ToolsChanged(_Value):
    """An MCP server's tool listing changed (schema 10): what the deferred inventory
    gained and lost from the next step on; ``unusable`` names listed tools whose schema
    lodger cannot use (each costs only itself)."""

    kind: Literal["tools_changed"] = "tools_changed"
    server: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unusable: tuple[str, ...] = ()


class ReplayStarted(_Value):
    """This session replays another's recorded inputs (schema 10): it is a fork of
    ``source_session`` at ``source_offset`` run again with ``model``; ``policy`` says how
    its calls are answered (``call_replayed`` says it per call)."""

    kind: Literal["replay_started"] = "replay_started"
    source_session: str
    source_offset: int
    model: str
    policy: str = "recorded"


class CallReplayed(_Value):
    """How a call in a replay was answered without touching the world (schema 10): from
    the recorded result at ``source_offset`` of the source session (``recorded``), run
    because it only reads (``live``), run in a sandbox on the workspace restored from the
    recorded snapshot (``sandbox``), or not run at all (``parked``)."""

    kind: Literal["call_replayed"] = "call_replayed"
    operation_id: str
    source: Literal["recorded", "live", "sandbox", "parked"]
    source_offset: int | None = None


class EvalScored(_Value):
    """A grader's verdict on an eval case run in this session (schema 10): ``passed`` for
    a yes/no grader, ``score`` (0 to 1) for a graded one, ``reason`` what it said."""

    kind: Literal["eval_scored"] = "eval_scored"
    eval_run: str
    case: str
    evaluator: str
    passed: bool | None = None
    score: float | None = None
    reason: str = ""


class RunEnded(_Value):
    kind: Literal["run_ended"] = "run_ended"
    status: Literal[
        "completed", "failed", "cancelled", "interrupted", "step_limit", "parked", "abandoned"
    ]
    error: str | None = None


class OutputRejected(_Value):
    """The model's final answer failed the turn's output type; ``message`` is what the
    model reads next (as a runtime message) so it can answer again."""

    kind: Literal["output_rejected"] = "output_rejected"
    message: str
    attempt: int


class TurnEnded(_Value):
    """A turn settled. ``reason`` says why an operator abandoned or cancelled it, when
    they said; ``output`` is the answer validated against the turn's output type, as JSON."""

    kind: Literal["turn_ended"] = "turn_ended"
    status: Literal["completed", "failed", "cancelled", "step_limit", "abandoned"]
    answer: str | None = None
    reason: str | None = None
    output: JsonValue | None = None


Body = Annotated[
    SessionStarted
    | TurnStarted
    | RunStarted
    | StepStarted
    | ModelOutput
    | ProviderRetried
    | ModelSwitched
    | BudgetReached
    | CallRejected
    | PermissionRequested
    | PermissionDecided
    | ToolDispatched
    | ToolResponded
    | ToolsActivated
    | RecoveryObserved
    | RecoveryDecided
    | OperatorDecision
    | ArtifactStored
    | WorkspaceSnapshot
    | ContextCompacted
    | Compacted
    | CompactionFailed
    | SteerReceived
    | SteerDelivered
    | MessageQueued
    | QueueChanged
    | CancelRequested
    | PermissionModeChanged
    | Rewound
    | FileCheckpoint
    | ProcessStarted
    | ProcessEnded
    | CallAccepted
    | ElicitationRequested
    | ElicitationAnswered
    | SamplingRequested
    | SamplingAnswered
    | ToolsChanged
    | ReplayStarted
    | CallReplayed
    | EvalScored
    | OutputRejected
    | RunEnded
    | TurnEnded,
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- envelope


#: the reason of the ``permission_decided`` fact an "always" answer records: the fold reads
#: it back as a grant for the rest of the session (``SessionState.always_allowed``)
ALWAYS_REASON = "always: the user allowed this tool for the rest of the session"


class EventDraft(_Value):
    """An event before it is appended: the log assigns offset, session and digest."""

    id: str
    ts: int
    body: Body
    turn_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    call_id: str | None = None
    parent_call_id: str | None = None
    origin: Origin = "runtime"
    visibility: Visibility = "model"


class Event(_Value):
    """One committed fact at ``offset`` in ``session_id``'s log."""

    v: int = SCHEMA_VERSION
    offset: int
    session_id: str
    id: str
    ts: int
    body: Body
    turn_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    call_id: str | None = None
    parent_call_id: str | None = None
    origin: Origin = "runtime"
    visibility: Visibility = "model"
    digest: str = ""

    @property
    def kind(self) -> str:
        return self.body.kind


# ---------------------------------------------------------------- codec and chain


def canonical_json(value: Any) -> bytes:
    """Compact, key-sorted UTF-8 JSON; the one encoding every digest is computed over."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _canonical_tree(value: dict[str, Any]) -> bytes:
    """``canonical_json`` of a freshly dumped tree (no cycles): the same bytes, with an
    encoder made once (``json.dumps`` with options builds a new one on every call)."""
    return tree_encoder(value).encode("utf-8")


#: the canonical JSON text of an event's fields (a dict, ``digest`` left out), written
#: once for the event set at import (see ``lodger.events.encoding``)
_encode_event = compile_model_encoder(Event, exclude=frozenset({"digest"}), from_dict=True)


def canonical_bytes(event: Event) -> bytes:
    return canonical_json(event.model_dump(mode="json", exclude={"digest"}))


def chain_digest(prev_digest: str, data: bytes) -> str:
    h = hashlib.sha256(DIGEST_DOMAIN)
    h.update(bytes.fromhex(prev_digest))
    h.update(data)
    return h.hexdigest()


def keyed_chain_digest(mac: hmac.HMAC, prev_digest: str, data: bytes) -> str:
    """The keyed chain's digest. ``mac`` is ``hmac.new(key, HMAC_DIGEST_DOMAIN, "sha256")``,
    made once per key: copying it costs far less than keying a new HMAC per event."""
    h = mac.copy()
    h.update(bytes.fromhex(prev_digest))
    h.update(data)
    return h.hexdigest()


def _digest(mac: hmac.HMAC | None, prev_digest: str, data: bytes) -> str:
    if mac is None:
        return chain_digest(prev_digest, data)
    return keyed_chain_digest(mac, prev_digest, data)


def claimed_chain(first: bytes) -> tuple[ChainKind, str | None]:
    """The chain kind and key id that a session's first stored event claims, read before
    its digest can be checked (the claim says which digest to check it with).

    Anything but a ``session_started`` naming ``hmac-sha256`` is a plain chain: the
    decoder then checks (and rejects) whatever else is wrong with the bytes.
    """
    try:
        raw = json.loads(first)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "sha256", None
    body = raw.get("body") if isinstance(raw, dict) else None
    if not isinstance(body, dict) or body.get("kind") != "session_started":
        return "sha256", None
    if body.get("chain") != "hmac-sha256":
        return "sha256", None
    key_id = body.get("key_id")
    return "hmac-sha256", key_id if isinstance(key_id, str) else None


def seal(
    draft: EventDraft,
    *,
    session_id: str,
    offset: int,
    prev_digest: str,
    mac: hmac.HMAC | None = None,
) -> tuple[Event, bytes]:
    """Place a draft at ``offset``; return the committed event and its canonical bytes.

    ``mac`` keys the digest (see ``keyed_chain_digest``); None seals a plain chain.
    """
    # The draft is already validated: its fields become the event's without validating
    # again, and the precompiled encoder of ``Event`` writes the canonical bytes straight
    # from them (see ``lodger.events.encoding``). Anything it does not expect goes the
    # generic way (a pydantic dump and the key-sorting encoder), which gives the same
    # bytes or the error it always gave. Tests hold both equal to ``Event(...)`` plus
    # ``canonical_bytes``.
    fields = dict(draft.__dict__)
    fields["v"] = SCHEMA_VERSION
    fields["offset"] = offset
    fields["session_id"] = session_id
    try:
        data = _encode_event(fields).encode("utf-8")
    except Exception:  # noqa: BLE001 - the generic path decides what is wrong
        data = _seal_bytes_generic(draft, session_id=session_id, offset=offset)
    fields["digest"] = _digest(mac, prev_digest, data)
    return _construct(Event, fields), data


def _seal_bytes_generic(draft: EventDraft, *, session_id: str, offset: int) -> bytes:
    """The canonical bytes of ``draft`` at ``offset``, the generic way (dump and encode)."""
    encoded = draft.model_dump(mode="json")
    encoded.update(v=SCHEMA_VERSION, offset=offset, session_id=session_id)
    try:
        return _canonical_tree(encoded)
    except (ValueError, UnicodeEncodeError) as exc:  # NaN, infinities, lone surrogates
        raise UsageError(
            f"a {draft.body.kind} event for session {session_id!r} cannot be stored: {exc}",
            hint="events hold JSON values only: finite numbers and valid Unicode text",
            code="unencodable_event",
            session_id=session_id,
            offset=offset,
        ) from None


_ModelT = TypeVar("_ModelT", bound=BaseModel)


_new_object = object.__new__
_set_attribute = object.__setattr__
# the slots every pydantic model instance has, set through their descriptors directly
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


#: one "fields set" per model class, shared by every instance ``_construct`` makes: they
#: all have every field set, and a frozen model never adds to it (pydantic copies it
#: before changing it in ``model_copy``). A set per instance was one more object per
#: event that lives as long as the session, for the cycle collector to traverse.
_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}


def _all_fields(cls: type[BaseModel]) -> set[str]:
    found = _ALL_FIELDS.get(cls)
    if found is None:
        found = _ALL_FIELDS[cls] = set(cls.model_fields)
    return found


def _construct(cls: type[_ModelT], fields: dict[str, Any]) -> _ModelT:
    """A model from values that are already valid and complete (every field given).

    What ``model_construct`` does without its per-call defaults and alias handling,
    which cost more than the rest of an append's CPU work. Callers pass every field.
    """
    obj = _new_object(cls)
    _set_attribute(obj, "__dict__", fields)
    _set_fields_set(obj, _ALL_FIELDS.get(cls) or _all_fields(cls))
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def new_prefix(high_water: int, digest: str) -> Prefix:
    """A ``Prefix`` from values the log computed itself (an offset and a digest it made),
    without validating them again: every append makes one."""
    return _construct(Prefix, {"high_water": high_water, "digest": digest})


def new_draft(
    *,
    id: str,
    ts: int,
    body: Body,
    turn_id: str | None,
    run_id: str | None,
    step_id: str | None,
    call_id: str | None,
    parent_call_id: str | None,
    origin: Origin,
    visibility: Visibility,
) -> EventDraft:
    """An ``EventDraft`` from typed values, without validating them again (the body is a
    validated model and mypy checks the rest): the hot path of every fact."""
    return _construct(
        EventDraft,
        {
            "id": id,
            "ts": ts,
            "body": body,
            "turn_id": turn_id,
            "run_id": run_id,
            "step_id": step_id,
            "call_id": call_id,
            "parent_call_id": parent_call_id,
            "origin": origin,
            "visibility": visibility,
        },
    )


_FIELD_ERRORS = {
    "extra_forbidden": "unknown_field",
    "union_tag_invalid": "unknown_kind",
    "union_tag_not_found": "missing_kind",
    "missing": "missing_field",
}


def _corrupt(session_id: str, offset: int, code: str, why: str) -> CorruptLogError:
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {offset}: {why}",
        hint=(
            "the stored event was changed outside lodger or written by a newer version; "
            f"restore the log from a backup or fork the session from offset {offset}"
        ),
        code=code,
        session_id=session_id,
        offset=offset,
    )


def decode_event(
    data: bytes,
    *,
    session_id: str,
    offset: int,
    digest: str,
    prev_digest: str,
    mac: hmac.HMAC | None = None,
) -> Event:
    """Decode one stored event and check it against the chain; fail closed on anything odd.

    ``mac`` checks a keyed chain (see ``keyed_chain_digest``); None a plain one.
    """
    try:
        computed = _digest(mac, prev_digest, data)
    except ValueError:
        # only a digest taken on trust (a read from a later offset) can be malformed
        raise _corrupt(
            session_id,
            max(offset - 1, 0),
            "digest_mismatch",
            "its stored digest is not a hex sha256",
        ) from None
    if computed != digest:
        raise _chain_broken(
            data,
            session_id=session_id,
            offset=offset,
            digest=digest,
            prev_digest=prev_digest,
            keyed=mac is not None,
        )
    try:
        # The digest is not part of the stored bytes; splicing it into the object lets
        # one validation build the final event (a model_copy per event costs more than
        # the validation itself on long logs).
        if not data.endswith(b"}") or data == b"{}":
            raise _explain_undecodable(data, session_id=session_id, offset=offset)
        event = Event.model_validate_json(b'%s,"digest":"%s"}' % (data[:-1], digest.encode()))
    except ValidationError as exc:
        raise _explain_invalid(data, exc, session_id=session_id, offset=offset) from None
    if event.v > SCHEMA_VERSION:
        raise _corrupt(
            session_id,
            offset,
            "newer_schema",
            f"schema version {event.v} is newer than this lodger reads ({SCHEMA_VERSION})",
        )
    if event.offset != offset:
        raise _corrupt(
            session_id, offset, "offset_mismatch", f"the event says it is at offset {event.offset}"
        )
    if event.session_id != session_id:
        raise _corrupt(
            session_id,
            offset,
            "session_mismatch",
            f"the event belongs to session {event.session_id!r}",
        )
    return event


def _chain_broken(
    data: bytes, *, session_id: str, offset: int, digest: str, prev_digest: str, keyed: bool
) -> CorruptLogError:
    if not keyed:
        return _corrupt(
            session_id,
            offset,
            "digest_mismatch",
            "its digest does not match its bytes and the previous digest (broken chain)",
        )
    if chain_digest(prev_digest, data) == digest:
        # Only someone without the key writes a plain digest into a keyed chain.
        return CorruptLogError(
            f"log for session {session_id!r} is forged at offset {offset}: the session's "
            "chain is keyed, and this event carries a plain sha256 digest recomputed over "
            "changed bytes",
            hint="someone with write access to the state directory but without the log key "
            f"rewrote the log; treat every event from offset {offset} on as untrusted, "
            f"restore the log from a backup or fork the session from offset {offset}",
            code="forged",
            session_id=session_id,
            offset=offset,
        )
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {offset}: its keyed digest "
        "does not match its bytes and the previous digest (changed after it was written, "
        "by damage or by someone without the log key)",
        hint="restore the log from a backup or fork the session from offset "
        f"{offset}; do not trust events from offset {offset} on",
        code="digest_mismatch",
        session_id=session_id,
        offset=offset,
    )


def _explain_undecodable(data: bytes, *, session_id: str, offset: int) -> CorruptLogError:
    return _corrupt(
        session_id, offset, "undecodable", "the stored bytes are not a JSON object (torn write?)"
    )


def _explain_invalid(
    data: bytes, exc: ValidationError, *, session_id: str, offset: int
) -> CorruptLogError:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return _corrupt(
            session_id, offset, "undecodable", "the stored bytes are not JSON (torn write?)"
        )
    if isinstance(raw, dict):
        version = raw.get("v")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            return _corrupt(
                session_id,
                offset,
                "newer_schema",
                f"schema version {version} is newer than this lodger reads ({SCHEMA_VERSION})",
            )
    first = exc.errors()[0]
    code = _FIELD_ERRORS.get(first["type"], "invalid_field")
    where = ".".join(str(part) for part in first["loc"]) or "event"
    return _corrupt(session_id, offset, code, f"{where}: {first['msg']}")
