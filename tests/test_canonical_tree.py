"""The reused encoder of ``seal`` writes exactly the bytes of ``canonical_json``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger.events import _canonical_tree, canonical_json

trees = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**80), 2**80)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=12,
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_same_bytes_as_canonical_json(tree: dict[str, Any]) -> None:
    assert _canonical_tree(tree) == canonical_json(tree)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"a": math.nan}, ValueError),
        ({"a": [math.inf]}, ValueError),
        ({"a": "\ud800"}, UnicodeEncodeError),
        ({"a": object()}, TypeError),
    ],
)
def test_same_refusals_as_canonical_json(bad: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        canonical_json(bad)
    with pytest.raises(error):
        _canonical_tree(bad)
