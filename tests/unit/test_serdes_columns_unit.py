"""kasper_py.serdes column decoders (what a packed repartition record's columns go
through): the values decoding each alone would give, or the error it would raise,
whatever the column's values join into."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import JSON, STRING, SerdeError
from kasper_py.serdes import column_decoder, column_encoder

FRAGMENTS = [b"1", b"-2", b"1,2", b"[3", b"4]", b"3,4]", b'"a,b"', b'"a', b'b"', b'",', b"{",
             b"}", b'{"k":1,"j":[2,3]}', b'"k":1', b" 5", b"6 ", b"null", b"[1,2]", b"[]",
             b'"\xc3\xa9,"', b"\xff", b"true", b"1.5", b",", b"]", b"["]
"""Values, JSON or not, that join into JSON text in many ways."""


def _each(column: list[bytes | None]) -> list[object]:
    return [JSON.decode(value) for value in column]


@pytest.mark.parametrize("column", [
    [b"1,2", b"[3", b"4]"], [b"[3", b"4]", b"1,2"], [b'"a', b'b"', b"1,2"],
    [b'{"a":1', b'"b":2}', b"3,4"], [b"1,[2", b"3],4", b"5"], [b'"x,', b'",1', b"2"],
], ids=repr)
def test_values_that_join_into_json_of_the_right_count_fail_as_each_would(
        column: list[bytes | None]) -> None:
    """Values each invalid JSON that join into an array of as many items (the crafted
    frame: ``1,2``, ``[3``, ``4]``) raise the SerdeError of the first bad value, naming
    it and its place, not wrong values."""
    with pytest.raises(SerdeError) as refused:
        _each(column)
    first = next(i for i, value in enumerate(column) if _refused(value))
    with pytest.raises(SerdeError, match="invalid JSON") as raised:
        column_decoder(JSON)(column)
    assert str(raised.value).startswith(str(refused.value))
    assert f"(value {first} of the column: {column[first]!r})" in str(raised.value)


def _refused(value: bytes | None) -> bool:
    try:
        JSON.decode(value)
    except SerdeError:
        return True
    return False


def test_good_columns_decode_to_each_values() -> None:
    """JSON values with and without commas of their own, strings with commas, non-ASCII
    text, whitespace around values and None all decode as each alone would."""
    for column in ([b"1", b"2", b"3"], [b'"a,b"', b"[1,2]", b'{"k":1,"j":2}', b"7"],
                   [b'"\xc3\xa9,"', b"1", b'{"\xc3\xa9":[1,2]}'], [b" 1", b"2 ", b'"a,"'],
                   [b"1", None, b"[2,3]"]):
        assert column_decoder(JSON)(column) == _each(column)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS) | st.none(), min_size=1, max_size=8))
def test_any_column_decodes_or_fails_as_its_values_each_would(
        column: list[bytes | None]) -> None:
    """Random columns of fragments: the same values as decoding each, or a SerdeError
    when decoding some value alone raises one."""
    try:
        wanted = _each(column)
    except SerdeError:
        with pytest.raises(SerdeError):
            column_decoder(JSON)(column)
    else:
        assert column_decoder(JSON)(column) == wanted


def test_the_string_column_names_the_value_that_is_not_utf8() -> None:
    """A str column with bad UTF-8 raises naming the byte and the value's place."""
    with pytest.raises(SerdeError, match=r"invalid UTF-8 at byte 0 \(value 1 of the column: "
                                         r"b'\\xff'\)"):
        column_decoder(STRING)([b"ok", b"\xff"])


@pytest.mark.parametrize("column", [
    [1] * 50 + [2, -3, 10**30] * 5, [True, 1, 1, 1, 1, 1, 1, 1, 1.0], list(range(20)),
    ["w", "w", "x"] * 10, [1, None, b"raw", 1, 1, 1, 1, 1],
], ids=["repeating ints", "bools and floats among ints", "distinct ints", "strings",
        "None and bytes"])
def test_a_column_encodes_to_each_values_bytes(column: list[object]) -> None:
    """Encoding a column (repeating ints each printed once) gives the bytes each value's
    own encoding gives, in order; True stays true and 1.0 stays 1.0 beside 1."""
    expected = [v if v is None or type(v) is bytes else JSON.encode(v) for v in column]
    assert column_encoder(JSON.encode)(column) == expected
