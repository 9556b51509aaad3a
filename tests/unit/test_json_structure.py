"""Issue 40 (M3, and the deeply nested body): a JSON body's values, keys and nesting are
counted from its text before anything is parsed (anex/api/parsers.py). The count is exact
for any JSON, however its strings are spelt (escapes, quotes and brackets inside them,
indentation), so a limit refuses exactly the bodies past it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anex.api.parsers import JsonRefused, json_bounded_loads, json_structure_check

# Strings heavy in what a scanner could trip on: quotes, backslashes, brackets, separators.
TRICKY = st.text(alphabet=st.sampled_from('"\\[]{}:,\n /u0aé😀'), max_size=8) | st.text(max_size=6)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                 allow_infinity=False) | TRICKY
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(TRICKY, inner, max_size=4), max_leaves=30)


def items_of(value: Any) -> int:
    """Values and keys, an empty array or object counting one more (its bracket)."""
    if isinstance(value, list):
        return (len(value) or 1) + sum(items_of(child) for child in value)
    if isinstance(value, dict):
        return (2 * len(value) or 1) + sum(items_of(child) for child in value.values())
    return 0


def depth_of(value: Any) -> int:
    children = value if isinstance(value, list) else \
        list(value.values()) if isinstance(value, dict) else None
    if children is None:
        return 0
    return 1 + max((depth_of(child) for child in children), default=0)


def refused(text: str, *, items: int, depth: int) -> JsonRefused | None:
    try:
        json_structure_check(text, items=items, depth=depth)
    except JsonRefused as refusal:
        return refusal
    return None


@settings(max_examples=600, deadline=None)
@given(value=values, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_the_count_and_the_depth_are_exact_however_the_json_is_written(
        value: Any, ascii_only: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    items, depth = 1 + items_of(value), depth_of(value)
    # at its own count and depth it passes, and parses to itself
    assert refused(text, items=items, depth=max(depth, 1)) is None
    assert json_bounded_loads(text, items=items, depth=max(depth, 1)) == value
    # one item fewer is too many; one level fewer too deep
    over = refused(text, items=items - 1, depth=max(depth, 1))
    assert over is not None and over.too_large
    if depth >= 1:
        deep = refused(text, items=items, depth=depth - 1)
        assert deep is not None and not deep.too_large


def test_nine_million_empty_objects_are_refused_by_their_count() -> None:
    text = "[" + "{}," * (26 * 1024 * 1024 // 3 - 1) + "{}]"
    refusal = refused(text, items=4096, depth=128)
    assert refusal is not None and refusal.too_large
    assert "more than 4,096 JSON values and keys" in refusal.message


@pytest.mark.parametrize("text", [
    '"' + '\\"' * 1_000_000,  # one unterminated string of escaped quotes
    '["' + '", "' * 1_000_000 + '"]',  # a million strings
    '"\\' * 1_000_000,  # quotes and backslashes that pair up no way JSON reads them
])
def test_texts_of_strings_are_counted_without_a_pass_per_string(text: str) -> None:
    # Each refused or passed in one pass of C; none is JSON the parser would take anyway.
    result = refused(text, items=4096, depth=128)
    assert result is None or result.too_large


def test_a_thousand_levels_are_refused_before_json_recurses() -> None:
    text = '{"model": ' + "[" * 5000 + "]" * 5000 + "}"
    refusal = refused(text, items=100_000, depth=128)
    assert refusal is not None and not refusal.too_large
    assert refusal.message == ("The request body nests JSON arrays and objects more than "
                               "128 levels deep.")
    # brackets inside a string are text, not nesting
    assert refused(json.dumps({"model": "[" * 5000}), items=10, depth=2) is None


def test_what_is_not_json_is_json_s_own_error() -> None:
    for text in ("{", '{"a": NaN}', "[1,]", "", "\ud800"):
        with pytest.raises(ValueError) as caught:
            json_bounded_loads(text, items=100)
        assert not isinstance(caught.value, JsonRefused)
