"""The precompiled event encoders write exactly the bytes of the generic path.

``seal`` writes canonical bytes with encoders generated per event kind
(``lodger.events.encoding``); the digest chain is computed over those bytes, so they
must equal ``canonical_json(model_dump(mode="json"))`` for every event that can exist.
Random events of every kind, built through validation, are sealed both ways here and
their bytes and digests compared; values the generated code does not expect must fall
back to the generic path, never produce other bytes.
"""

from __future__ import annotations

import hmac
import math
import types
import typing
from typing import Any, Literal, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, JsonValue

from lodger import events as ev
from lodger.errors import UsageError
from lodger.events.encoding import compile_model_encoder

BODY_KINDS: tuple[type[BaseModel], ...] = typing.get_args(typing.get_args(ev.Body)[0])

# Text with everything JSON escapes or passes through: quotes, backslashes, control
# characters, non-ASCII, astral characters (no lone surrogates: those cannot be stored).
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=10,
)


def strategy(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of ``annotation`` as the event models declare it (written apart from the
    encoder's own reading of the annotations, so a shared mistake is unlikely)."""
    if annotation is JsonValue:
        return json_values
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is str:
        return text
    if annotation is int:
        return st.integers(-(2**63), 2**63)
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if annotation is bool:
        return st.booleans()
    if origin is Literal:
        return st.sampled_from(args)
    if origin is typing.Annotated:
        return strategy(args[0])
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy(a) for a in args))
    if annotation is type(None):
        return st.none()
    if origin is tuple:
        return st.lists(strategy(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(strategy(args[0]), strategy(args[1]), max_size=3)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model(annotation)
    raise AssertionError(f"no strategy for {annotation!r}")


def model(cls: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` made through validation, optional fields sometimes left out."""
    fields = {}
    for name, info in cls.model_fields.items():
        if name == "kind":
            continue
        values = strategy(info.annotation)
        if not info.is_required():
            values = st.one_of(st.just(_DEFAULT), values)
        fields[name] = values
    return st.fixed_dictionaries(fields).map(
        lambda kw: cls(**{k: v for k, v in kw.items() if v is not _DEFAULT})
    )


_DEFAULT = object()

drafts = st.builds(
    ev.EventDraft,
    id=text,
    ts=st.integers(0, 2**62),
    body=st.one_of(*(model(kind) for kind in BODY_KINDS)),
    turn_id=st.none() | text,
    run_id=st.none() | text,
    step_id=st.none() | text,
    call_id=st.none() | text,
    parent_call_id=st.none() | text,
    origin=st.sampled_from(["provider", "code_mode", "runtime", "operator"]),
    visibility=st.sampled_from(["model", "hidden"]),
)
digests = st.binary(min_size=32, max_size=32).map(bytes.hex) | st.just("")


def _generic(draft: ev.EventDraft, *, session_id: str, offset: int) -> bytes:
    """The canonical bytes as the validated event and ``canonical_bytes`` give them."""
    slow = ev.Event(
        offset=offset,
        session_id=session_id,
        **{k: getattr(draft, k) for k in ev.EventDraft.model_fields},
    )
    return ev.canonical_bytes(slow)


def test_every_kind_of_the_body_union_is_covered() -> None:
    kinds = {cls.model_fields["kind"].default for cls in BODY_KINDS}
    assert len(kinds) == len(BODY_KINDS) == 44


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draft=drafts, session_id=text, offset=st.integers(0, 2**40), prev=digests)
def test_sealed_bytes_and_digests_equal_the_generic_path(
    draft: ev.EventDraft, session_id: str, offset: int, prev: str
) -> None:
    event, data = ev.seal(draft, session_id=session_id, offset=offset, prev_digest=prev)
    # the precompiled encoder itself wrote them (a fallback would hide a broken encoder)
    fields = {**draft.__dict__, "v": ev.SCHEMA_VERSION, "offset": offset, "session_id": session_id}
    assert ev._encode_event(fields).encode() == data
    assert data == _generic(draft, session_id=session_id, offset=offset)
    assert data == ev._seal_bytes_generic(draft, session_id=session_id, offset=offset)
    assert event.digest == ev.chain_digest(prev, data)
    assert event == ev.decode_event(
        data, session_id=session_id, offset=offset, digest=event.digest, prev_digest=prev
    )


@settings(max_examples=60, deadline=None)
@given(draft=drafts, prev=digests)
def test_keyed_digests_equal_too(draft: ev.EventDraft, prev: str) -> None:
    mac = hmac.new(b"k" * 32, ev.HMAC_DIGEST_DOMAIN, "sha256")
    event, data = ev.seal(draft, session_id="s", offset=7, prev_digest=prev, mac=mac)
    assert data == _generic(draft, session_id="s", offset=7)
    assert event.digest == ev.keyed_chain_digest(mac, prev, data)


@pytest.mark.parametrize("kind", BODY_KINDS, ids=lambda k: k.__name__)
def test_each_kind_with_its_defaults(kind: type[BaseModel]) -> None:
    """The smallest valid body of each kind (every default), sealed both ways."""
    draft = ev.EventDraft(id="e", ts=1, body=_smallest(kind))
    _, data = ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert data == _generic(draft, session_id="s", offset=0)
    fields = {**draft.__dict__, "v": ev.SCHEMA_VERSION, "offset": 0, "session_id": "s"}
    assert ev._encode_event(fields).encode() == data  # not the fallback


def _smallest(annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is str:
        return ""
    if annotation is int:
        return 0
    if origin is Literal:
        return args[0]
    if origin is tuple:
        return ()
    if origin is dict:
        return {}
    if origin in (Union, types.UnionType):
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation(
            **{
                name: _smallest(info.annotation)
                for name, info in annotation.model_fields.items()
                if info.is_required()
            }
        )
    raise AssertionError(annotation)


# ------------------------------------------------------------------ what it must not take


def _unvalidated(body: BaseModel, **changes: Any) -> ev.EventDraft:
    """A draft over a body whose fields were changed behind validation's back."""
    broken = body.model_construct(**{**body.__dict__, **changes})
    return ev.EventDraft.model_construct(id="e", ts=1, body=broken)


@pytest.mark.parametrize(
    "draft",
    [
        # a bool where an int belongs: repr would write True, JSON says true
        _unvalidated(ev.OutputRejected(message="m", attempt=1), attempt=True),
        # a list where a tuple of models belongs, of dicts instead of models
        _unvalidated(ev.ModelOutput(), calls=[{"call_id": "c", "name": "n", "arguments": ""}]),
        # an int subclass (IntEnum-like): its repr is not JSON
        _unvalidated(
            ev.ProviderRetried(attempt=1, error="e", delay_ms=1),
            delay_ms=type("Big", (int,), {"__repr__": lambda self: "big"})(3),
        ),
    ],
    ids=["bool-for-int", "dicts-for-models", "int-subclass"],
)
def test_unexpected_values_take_the_generic_path(draft: ev.EventDraft) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns about serializing the wrong type
        expected = ev._seal_bytes_generic(draft, session_id="s", offset=0)
        _, data = ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert data == expected


def test_a_body_subclass_is_encoded_as_its_declared_kind() -> None:
    class Louder(ev.TurnStarted):
        pass

    body = Louder(input="hi")
    draft = ev.EventDraft.model_construct(id="e", ts=1, body=body)
    _, data = ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert data == ev._seal_bytes_generic(draft, session_id="s", offset=0)


@pytest.mark.parametrize(
    "arguments",
    [{"x": math.nan}, {"x": [math.inf]}, {"x": "\ud800"}],
    ids=["nan", "inf", "lone-surrogate-value"],
)
def test_unencodable_values_are_refused_as_before(arguments: dict[str, Any]) -> None:
    draft = ev.EventDraft(
        id="e",
        ts=1,
        body=ev.ToolDispatched.model_construct(
            **{
                **ev.ToolDispatched(operation_id="o", tool="t", arguments={}).__dict__,
                "arguments": arguments,
            }
        ),
    )
    with pytest.raises(UsageError) as info:
        ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert info.value.code == "unencodable_event"


def test_a_lone_surrogate_key_gets_the_generic_paths_bytes() -> None:
    """pydantic's dump replaces a lone surrogate in a dict key (U+FFFD per byte) instead
    of refusing it; the precompiled path cannot encode the key and so gives the same."""
    body = ev.ToolDispatched(operation_id="o", tool="t", arguments={})
    broken = ev.ToolDispatched.model_construct(**{**body.__dict__, "arguments": {"\udfff": 1}})
    draft = ev.EventDraft.model_construct(id="e", ts=1, body=broken)
    _, data = ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert data == ev._seal_bytes_generic(draft, session_id="s", offset=0)
    assert b"\xef\xbf\xbd" in data


def test_a_lone_surrogate_in_a_plain_string_field_is_refused() -> None:
    draft = ev.EventDraft(id="e", ts=1, body=ev.TurnStarted(input="a\udc80b"))
    with pytest.raises(UsageError) as info:
        ev.seal(draft, session_id="s", offset=0, prev_digest="")
    assert info.value.code == "unencodable_event"


def test_a_model_encoder_matches_its_dump() -> None:
    """The encoders of nested values stand on their own too (the same generator)."""
    encode = compile_model_encoder(ev.Prefix)
    value = ev.Prefix(high_water=3, digest='ab\n"')
    assert encode(value) == ev.canonical_json(value.model_dump(mode="json")).decode()
