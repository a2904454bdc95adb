"""``visible_text``: any Python string becomes text the log can store, valid text unchanged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lodger._core.text import is_valid_utf8, visible_text


# Lone surrogates (category Cs) as often as any other character.
@given(st.text(alphabet=st.characters(categories=["Cs"]) | st.characters()))
def test_any_text_becomes_storable_and_valid_text_is_unchanged(text: str) -> None:
    shown = visible_text(text)
    shown.encode("utf-8")
    assert is_valid_utf8(shown)
    if is_valid_utf8(text):
        assert shown == text


def test_escaped_bytes_and_lone_surrogates_are_written_out() -> None:
    assert visible_text("caf\udce9.txt") == "caf\\xe9.txt"  # os.fsdecode(b"caf\xe9.txt")
    assert visible_text("x\ud800y\udfff") == "x\\ud800y\\udfff"  # from JSON escapes
    assert not is_valid_utf8("caf\udce9")
