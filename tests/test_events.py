"""The event codec and digest chain: round trips, stable bytes, corruption always detected."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lodger.events as events_module
from lodger.errors import CorruptLogError
from lodger.events import (
    DIGEST_DOMAIN,
    HMAC_DIGEST_DOMAIN,
    SCHEMA_CHANGELOG,
    SCHEMA_VERSION,
    ArtifactRef,
    ArtifactStored,
    Body,
    BudgetReached,
    CallAccepted,
    CallRejected,
    CallReplayed,
    CancelRequested,
    Compacted,
    CompactionFailed,
    ContextCompacted,
    ElicitationAnswered,
    ElicitationRequested,
    EvalScored,
    Event,
    EventDraft,
    FileCheckpoint,
    FileExpectation,
    ForkParent,
    MessageQueued,
    ModelOutput,
    ModelSwitched,
    OperatorDecision,
    OutputRejected,
    PermissionDecided,
    PermissionModeChanged,
    PermissionRequested,
    Prefix,
    ProcessEnded,
    ProcessStarted,
    ProposedCall,
    ProviderRetried,
    QueueChanged,
    RecoveryDecided,
    RecoveryObserved,
    ReplayStarted,
    Rewound,
    RunEnded,
    RunStarted,
    SamplingAnswered,
    SamplingRequested,
    SessionStarted,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    ToolsActivated,
    ToolsChanged,
    TurnEnded,
    TurnStarted,
    Usage,
    WorkspaceSnapshot,
    canonical_bytes,
    chain_digest,
    decode_event,
    keyed_chain_digest,
    seal,
)

# ---------------------------------------------------------------- strategies

text = st.text(max_size=24)  # hypothesis text never holds lone surrogates
opt_text = st.none() | text
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
counts = st.integers(min_value=0, max_value=10**9)
hex_digest = st.binary(min_size=32, max_size=32).map(bytes.hex)
names = st.tuples(text, text, text).map(lambda t: tuple(x for x in t if x))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=16,
)

usages = st.builds(Usage, input_tokens=counts, output_tokens=counts)
artifacts = st.builds(
    ArtifactRef, sha256=hex_digest, size=counts, media_type=st.sampled_from(["text/plain", "a/b"])
)
prefixes = st.builds(Prefix, high_water=counts, digest=hex_digest)
triggers = st.sampled_from(["manual", "threshold", "overflow", "context_error"])
modes = st.sampled_from(["plan", "ask", "accept_edits", "full_auto"])
proposed_calls = st.builds(ProposedCall, call_id=text, name=text, arguments=text)
expectations = st.builds(
    FileExpectation, path=text, before_sha256=st.none() | hex_digest, after_sha256=hex_digest
)

BODIES: dict[str, st.SearchStrategy[typing.Any]] = {
    "session_started": st.builds(
        SessionStarted,
        workspace=opt_text,
        workspace_id=opt_text,
        parent=st.none()
        | st.builds(ForkParent, session_id=text, high_water=counts, digest=hex_digest),
        metadata=st.dictionaries(text, text, max_size=3),
    ),
    "turn_started": st.builds(TurnStarted, input=text),
    "run_started": st.builds(
        RunStarted,
        model=text,
        parent_run_id=opt_text,
        resumed_from=st.none() | prefixes,
        tools=names,
    ),
    "step_started": st.builds(
        StepStarted,
        index=counts,
        model=text,
        tools=st.lists(st.builds(ToolRef, name=text, schema_digest=hex_digest), max_size=3).map(
            tuple
        ),
    ),
    "model_output": st.builds(
        ModelOutput,
        text=text,
        reasoning=text,
        calls=st.lists(proposed_calls, max_size=4).map(tuple),
        usage=st.none() | usages,
        finish_reason=opt_text,
    ),
    "provider_retried": st.builds(ProviderRetried, attempt=counts, error=text, delay_ms=counts),
    "model_switched": st.builds(ModelSwitched, from_model=text, to_model=text, error=text),
    "budget_reached": st.builds(
        BudgetReached, budget=text, limit=counts, spent=counts, unit=text, scope=text
    ),
    "call_rejected": st.builds(CallRejected, tool=text, reason=text, message=text),
    "permission_requested": st.builds(PermissionRequested, tool=text, summary=text),
    "permission_decided": st.builds(
        PermissionDecided,
        tool=text,
        decision=st.sampled_from(["allow", "deny"]),
        by=st.sampled_from(["policy", "user", "operator", "default"]),
        reason=text,
    ),
    "tool_dispatched": st.builds(
        ToolDispatched,
        operation_id=text,
        tool=text,
        arguments=st.dictionaries(text, json_values, max_size=5),
        attempt=counts,
        retry_of=opt_text,
        recovery=text,
        resources=names,
        expectations=st.lists(expectations, max_size=2).map(tuple),
    ),
    "tool_responded": st.builds(
        ToolResponded,
        operation_id=text,
        status=st.sampled_from(["ok", "error", "denied", "cancelled", "interrupted"]),
        content=text,
        truncated=st.booleans(),
        artifacts=st.lists(artifacts, max_size=2).map(tuple),
    ),
    "tools_activated": st.builds(ToolsActivated, query=text, names=names),
    "recovery_observed": st.builds(
        RecoveryObserved, operation_id=text, status=text, reason=text, observation=text
    ),
    "recovery_decided": st.builds(RecoveryDecided, operation_id=text, action=text, reason=text),
    "operator_decision": st.builds(
        OperatorDecision,
        operation_id=text,
        decision=st.sampled_from(["completed", "not_applied", "abandon"]),
        result=opt_text,
        by=text,
    ),
    "artifact_stored": st.builds(ArtifactStored, artifact=artifacts, name=text),
    "workspace_snapshot": st.builds(WorkspaceSnapshot, ref=text, files=counts, size=counts),
    "context_compacted": st.builds(
        ContextCompacted,
        elided_call_ids=names,
        budget_tokens=counts,
        estimated_tokens=counts,
    ),
    "run_ended": st.builds(
        RunEnded,
        status=st.sampled_from(
            ["completed", "failed", "cancelled", "interrupted", "step_limit", "parked", "abandoned"]
        ),
        error=opt_text,
    ),
    "turn_ended": st.builds(
        TurnEnded,
        status=st.sampled_from(["completed", "failed", "cancelled", "step_limit", "abandoned"]),
        answer=opt_text,
        output=st.none() | json_values,
    ),
    "output_rejected": st.builds(OutputRejected, message=text, attempt=counts),
    "compacted": st.builds(
        Compacted,
        covers=prefixes,
        summary=text,
        native_state=st.none() | st.dictionaries(text, json_values, max_size=3),
        dropped_call_ids=names,
        dropped_bytes=counts,
        dropped_tokens=counts,
        pinned=names,
        model=text,
        prompt_sha256=hex_digest,
        tokens_before=counts,
        tokens_after=counts,
        trigger=triggers,
        previous=st.none() | counts,
        usage=st.none() | usages,
    ),
    "compaction_failed": st.builds(
        CompactionFailed,
        covers=prefixes,
        trigger=triggers,
        attempts=counts,
        reason=text,
        fallback=st.sampled_from(["elision", "none"]),
        model=text,
        usage=st.none() | usages,
    ),
    "steer_received": st.builds(SteerReceived, steer_id=text, text=text, who=opt_text),
    "steer_delivered": st.builds(SteerDelivered, steer_ids=names, step=counts),
    "message_queued": st.builds(
        MessageQueued,
        message_id=text,
        text=text,
        policy=st.sampled_from(["enqueue", "reject", "interrupt", "rollback"]),
        who=opt_text,
    ),
    "queue_changed": st.builds(
        QueueChanged,
        message_id=text,
        action=st.sampled_from(["edit", "move", "retract", "delivered"]),
        text=opt_text,
        position=st.none() | counts,
        who=opt_text,
    ),
    "cancel_requested": st.builds(CancelRequested, who=opt_text, reason=text),
    "permission_mode_changed": st.builds(
        PermissionModeChanged, mode=modes, previous=st.none() | modes, who=opt_text
    ),
    "rewound": st.builds(
        Rewound,
        left=st.builds(ForkParent, session_id=text, high_water=counts, digest=hex_digest),
        to=prefixes,
        restored=counts,
        removed=counts,
        forced=names,
        who=opt_text,
    ),
    "process_started": st.builds(
        ProcessStarted,
        process_id=text,
        operation_id=text,
        command=text,
        pid=st.none() | counts,
        sandbox=text,
        keep=st.sampled_from(["turn", "session"]),
    ),
    "process_ended": st.builds(
        ProcessEnded,
        process_id=text,
        status=st.sampled_from(["exited", "stopped", "killed", "limit", "unknown"]),
        exit_code=st.none() | st.integers(min_value=-255, max_value=255),
        reason=text,
        output_bytes=counts,
    ),
    "call_accepted": st.builds(
        CallAccepted,
        operation_id=text,
        handle=st.dictionaries(text, json_values, max_size=3),
        wait=st.sampled_from(["continue", "wait"]),
    ),
    "file_checkpoint": st.builds(
        FileCheckpoint,
        operation_id=text,
        path=text,
        before_sha256=st.none() | hex_digest,
        after_sha256=st.none() | hex_digest,
        before=st.none() | artifacts,
    ),
    "elicitation_requested": st.builds(
        ElicitationRequested,
        elicitation_id=text,
        operation_id=text,
        server=text,
        mode=st.sampled_from(["form", "url"]),
        message=text,
        requested_schema=st.dictionaries(text, json_values, max_size=3),
        url=opt_text,
    ),
    "elicitation_answered": st.builds(
        ElicitationAnswered,
        elicitation_id=text,
        action=st.sampled_from(["accept", "decline", "cancel"]),
        content=st.dictionaries(text, json_values, max_size=3),
        withheld=names,
        by=st.sampled_from(["user", "operator", "policy", "timeout"]),
        who=opt_text,
    ),
    "sampling_requested": st.builds(
        SamplingRequested,
        sampling_id=text,
        operation_id=text,
        server=text,
        request=st.dictionaries(text, json_values, max_size=3),
        decision=st.sampled_from(["allow", "deny"]),
        reason=text,
    ),
    "sampling_answered": st.builds(
        SamplingAnswered,
        sampling_id=text,
        model=text,
        content=text,
        stop_reason=opt_text,
        usage=usages,
    ),
    "tools_changed": st.builds(
        ToolsChanged, server=text, added=names, removed=names, unusable=names
    ),
    "replay_started": st.builds(
        ReplayStarted, source_session=text, source_offset=counts, model=text, policy=text
    ),
    "call_replayed": st.builds(
        CallReplayed,
        operation_id=text,
        source=st.sampled_from(["recorded", "live", "sandbox", "parked"]),
        source_offset=st.none() | counts,
    ),
    "eval_scored": st.builds(
        EvalScored,
        eval_run=text,
        case=text,
        evaluator=text,
        passed=st.none() | st.booleans(),
        score=st.none() | st.floats(min_value=0, max_value=1),
        reason=text,
    ),
}

bodies = st.one_of(*BODIES.values())

drafts = st.builds(
    EventDraft,
    id=text,
    ts=ints,
    body=bodies,
    turn_id=opt_text,
    run_id=opt_text,
    step_id=opt_text,
    call_id=opt_text,
    parent_call_id=opt_text,
    origin=st.sampled_from(["provider", "code_mode", "runtime", "operator"]),
    visibility=st.sampled_from(["model", "hidden"]),
)

session_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z")


@st.composite
def sealed(draw: st.DrawFn) -> tuple[Event, bytes, str]:
    """A committed event, its stored bytes and the digest before it."""
    prev = draw(st.just("") | hex_digest)
    event, data = seal(
        draw(drafts),
        session_id=draw(session_ids),
        offset=draw(st.integers(min_value=0, max_value=2**40)),
        prev_digest=prev,
    )
    return event, data, prev


def decode(event: Event, data: bytes, prev: str, *, digest: str | None = None) -> Event:
    return decode_event(
        data,
        session_id=event.session_id,
        offset=event.offset,
        digest=event.digest if digest is None else digest,
        prev_digest=prev,
    )


def body_kinds() -> set[str]:
    (union, _field) = typing.get_args(Body)
    return {cls.model_fields["kind"].default for cls in typing.get_args(union)}


# ---------------------------------------------------------------- properties


def test_strategies_cover_every_body_kind() -> None:
    assert set(BODIES) == body_kinds()


@given(sealed())
def test_round_trip(case: tuple[Event, bytes, str]) -> None:
    event, data, prev = case
    assert data == canonical_bytes(event)
    decoded = decode(event, data, prev)
    assert decoded == event
    assert decoded.kind == event.body.kind
    assert event.digest == chain_digest(prev, data)


@given(sealed())
def test_bytes_are_stable(case: tuple[Event, bytes, str]) -> None:
    event, data, prev = case
    assert canonical_bytes(event) == canonical_bytes(event) == data
    # what a reader decodes encodes back to exactly the stored bytes
    assert canonical_bytes(decode(event, data, prev)) == data
    # canonical: compact, sorted keys, UTF-8, no digest inside
    raw = json.loads(data)
    assert "digest" not in raw
    assert list(raw) == sorted(raw)
    assert (
        data == json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )


@given(sealed(), st.data())
def test_any_single_byte_change_is_detected(
    case: tuple[Event, bytes, str], data_strategy: st.DataObject
) -> None:
    event, data, prev = case
    position = data_strategy.draw(st.integers(min_value=0, max_value=len(data) - 1))
    replacement = data_strategy.draw(
        st.integers(min_value=0, max_value=255).filter(lambda b: b != data[position])
    )
    damaged = data[:position] + bytes([replacement]) + data[position + 1 :]
    with pytest.raises(CorruptLogError) as info:
        decode(event, damaged, prev)
    err = info.value
    assert (err.code, err.session_id, err.offset) == (
        "digest_mismatch",
        event.session_id,
        event.offset,
    )


@pytest.mark.slow
@given(sealed(), st.data())
def test_any_change_to_the_digest_or_the_previous_digest_is_detected(
    case: tuple[Event, bytes, str], data_strategy: st.DataObject
) -> None:
    event, data, prev = case
    other = data_strategy.draw(hex_digest.filter(lambda d: d != event.digest))
    with pytest.raises(CorruptLogError):
        decode(event, data, prev, digest=other)
    other_prev = data_strategy.draw((st.just("") | hex_digest).filter(lambda d: d != prev))
    with pytest.raises(CorruptLogError):
        decode(event, data, other_prev)


def test_digest_formula() -> None:
    data = b'{"x":1}'
    prev = "ab" * 32
    assert (
        chain_digest(prev, data)
        == hashlib.sha256(DIGEST_DOMAIN + bytes(32 * [0xAB]) + data).hexdigest()
    )
    assert chain_digest("", data) == hashlib.sha256(DIGEST_DOMAIN + data).hexdigest()


_MAC = hmac.new(b"k" * 32, HMAC_DIGEST_DOMAIN, "sha256")


@given(sealed())
def test_keyed_round_trip_and_plain_and_keyed_digests_differ(
    case: tuple[Event, bytes, str],
) -> None:
    plain, _, prev = case
    draft = EventDraft(**{name: getattr(plain, name) for name in EventDraft.model_fields})
    event, data = seal(
        draft, session_id=plain.session_id, offset=plain.offset, prev_digest=prev, mac=_MAC
    )
    assert event.digest == keyed_chain_digest(_MAC, prev, data) != chain_digest(prev, data)
    assert decode_event(
        data, session_id=event.session_id, offset=event.offset, digest=event.digest,
        prev_digest=prev, mac=_MAC,
    ) == event  # fmt: skip
    with pytest.raises(CorruptLogError) as info:  # a plain reader refuses a keyed digest
        decode(event, data, prev)
    assert info.value.code == "digest_mismatch"


def test_keyed_digest_formula() -> None:
    data, prev = b'{"x":1}', "ab" * 32
    expected = hmac.new(b"k" * 32, HMAC_DIGEST_DOMAIN + bytes(32 * [0xAB]) + data, "sha256")
    assert keyed_chain_digest(_MAC, prev, data) == expected.hexdigest()
    assert HMAC_DIGEST_DOMAIN != DIGEST_DOMAIN


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        (lambda raw: raw.update(offset=raw["offset"] + 1), "offset_mismatch"),
        (lambda raw: raw.update(session_id="elsewhere"), "session_mismatch"),
        (lambda raw: raw["body"].update(kind="dream"), "unknown_kind"),
        (lambda raw: raw["body"].pop("kind"), "missing_kind"),
        (lambda raw: raw.update(extra=1), "unknown_field"),
        (lambda raw: raw.pop("id"), "missing_field"),
        (lambda raw: raw.update(ts="yesterday"), "invalid_field"),
        (lambda raw: raw.update(v=SCHEMA_VERSION + 1), "newer_schema"),
    ],
)
def test_decoder_rejects_well_chained_but_invalid_events(tamper: typing.Any, code: str) -> None:
    _, data = seal(
        EventDraft(id="e1", ts=5, body=TurnStarted(input="hi")),
        session_id="s1",
        offset=3,
        prev_digest="",
    )
    raw = json.loads(data)
    tamper(raw)
    bad = json.dumps(raw).encode()
    with pytest.raises(CorruptLogError) as info:
        decode_event(bad, session_id="s1", offset=3, digest=chain_digest("", bad), prev_digest="")
    assert (info.value.code, info.value.session_id, info.value.offset) == (code, "s1", 3)
    assert "'s1'" in str(info.value)
    assert "offset 3" in str(info.value)


# ---------------------------------------------------------------- schema


def test_schema_changelog_has_one_line_per_version() -> None:
    assert SCHEMA_VERSION >= 1
    assert sorted(SCHEMA_CHANGELOG) == list(range(1, SCHEMA_VERSION + 1))
    for line in SCHEMA_CHANGELOG.values():
        assert line.strip()
        assert "\n" not in line


def test_module_docstring_changelog_matches() -> None:
    doc = events_module.__doc__ or ""
    listed = {
        int(number): why.rstrip(".")
        for number, why in re.findall(r"^\s+(\d+)\s{2,}(.+)$", doc, flags=re.MULTILINE)
    }
    assert listed == dict(SCHEMA_CHANGELOG)


def test_new_events_carry_the_current_schema_version() -> None:
    event, data = seal(
        EventDraft(id="e", ts=0, body=RunStarted(model="m")),
        session_id="s",
        offset=0,
        prev_digest="",
    )
    assert event.v == SCHEMA_VERSION
    assert json.loads(data)["v"] == SCHEMA_VERSION
    assert isinstance(event.body, RunStarted)
    assert event.body.protocol == SCHEMA_VERSION


def test_seal_fast_path_equals_validated_construction() -> None:
    from lodger.events import EventDraft, ToolDispatched, canonical_bytes, chain_digest, seal

    draft = EventDraft(
        id="e1",
        ts=5,
        turn_id="t",
        call_id="c",
        body=ToolDispatched(operation_id="o", tool="x", arguments={"a": [1, 2.5, None]}),
    )
    event, data = seal(draft, session_id="s", offset=3, prev_digest="ab" * 32)
    slow = Event(
        offset=3, session_id="s", **{k: getattr(draft, k) for k in EventDraft.model_fields}
    )
    assert data == canonical_bytes(slow)
    assert event == slow.model_copy(update={"digest": chain_digest("ab" * 32, data)})
