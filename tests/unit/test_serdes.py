"""Serdes: round trips, pass-through of bytes, and errors that say what failed."""

from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import BYTES, JSON, STRING, SerdeError
from kasper_py.serdes import serde_for


def test_round_trips() -> None:
    """Each built-in serde decodes what it encodes; None stays None."""
    assert BYTES.decode(BYTES.encode(b"\x00\x01")) == b"\x00\x01"
    assert STRING.decode(STRING.encode("héllo")) == "héllo"
    assert JSON.decode(JSON.encode({"a": [1, 2]})) == {"a": [1, 2]}
    for serde in (BYTES, STRING, JSON):
        assert serde.encode(None) is None
        assert serde.decode(None) is None


def test_json_is_compact() -> None:
    """JSON output has no spaces, so message sizes stay small."""
    assert JSON.encode({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'


def test_json_whole_numbers_read_and_write_as_the_json_module_does() -> None:
    """Ints take a shorter path than the json module, with the same bytes and values;
    what is not a JSON integer (leading zeros, underscores) is still refused."""
    for number in (0, 7, -42, 10**30, True, 2.5):
        assert JSON.encode(number) == json.dumps(number).encode()
        assert JSON.decode(JSON.encode(number)) == number
    assert JSON.decode(b"-0") == 0
    for bad in (b"007", b"-01", b"1_000", b"-", b" 1x"):
        with pytest.raises(SerdeError, match="invalid JSON"):
            JSON.decode(bad)


def test_errors_name_the_problem() -> None:
    """Bad input raises SerdeError with the reason."""
    with pytest.raises(SerdeError, match="invalid JSON"):
        JSON.decode(b"{not json")
    with pytest.raises(SerdeError, match="invalid UTF-8"):
        STRING.decode(b"\xff\xfe")
    with pytest.raises(SerdeError, match="cannot encode int"):
        BYTES.encode(5)
    with pytest.raises(SerdeError, match="cannot encode set"):
        JSON.encode({1, 2})


def test_serde_for_resolves_names_and_custom_serdes() -> None:
    """Names map to the built-ins; any object with encode/decode plugs in."""

    class Upper:
        name = "upper"

        def encode(self, value: object) -> bytes:
            return str(value).upper().encode()

        def decode(self, data: bytes | None) -> object:
            return None if data is None else data.decode().lower()

    assert serde_for("str") is STRING
    assert [serde_for(built_in) for built_in in (BYTES, STRING, JSON)] == [BYTES, STRING, JSON]
    custom = Upper()
    assert serde_for(custom) is custom
    with pytest.raises(ValueError, match="unknown serde 'xml'"):
        serde_for("xml")
    with pytest.raises(ValueError, match="not a serde"):
        serde_for(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Upper is not a serde"):
        del Upper.decode
        serde_for(custom)


# -- the JSON serde's short paths: the json module's very bytes and values -------------

def _old_encode(value: object) -> bytes:
    """How the JSON serde encoded before its short paths: what a changelog, a store or
    a repartition written by an older version holds."""
    return json.dumps(value, separators=(",", ":")).encode()


def _same(found: object, wanted: object) -> bool:
    """Equal, of the same type all the way down (1 is not 1.0 nor True), NaN equal to NaN."""
    if isinstance(wanted, float) and math.isnan(wanted):
        return isinstance(found, float) and math.isnan(found)
    if type(found) is not type(wanted):
        return False
    if isinstance(wanted, dict):
        assert isinstance(found, dict)
        return list(found) == list(wanted) and all(_same(found[k], wanted[k]) for k in wanted)
    if isinstance(wanted, list):
        assert isinstance(found, list)
        return len(found) == len(wanted) and all(map(_same, found, wanted))
    return found == wanted


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


PLAIN_VALUES: list[object] = [
    "", "word", "with space", 'quote " and \\ backslash', "tab\tnew\nline\r\x00\x1f\x7f",
    "/slash", "héllo wörld", "日本語", "emoji 😀 astral", "\ud800 lone surrogate",
    "\u2028\u2029", 0, 1, -1, 7, -42, 10**18, -(10**30), 2**64 + 1, 10**4000, True, False,
    0.0, -0.0, 1.5, -2.25, 0.1 + 0.2, 1e300, 1e-300, 5e-324, 1e16, 123456789.0,
    float("nan"), float("inf"), float("-inf"),
    {"a": 1, "b": [1, "x", None, True, 2.5]}, [], {}, ["nested", ["deeper", {"k": "v"}]],
    (1, "tuple"), Colour.RED, Level.HIGH,
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_json_writes_the_bytes_the_json_module_writes(value: object) -> None:
    """Every kind of value, short path or not, encodes to json.dumps's very bytes: a table
    or changelog written by an older version reads back the same, and keys written
    now find the keys written then."""
    assert JSON.encode(value) == _old_encode(value)


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_json_reads_old_bytes_and_the_json_module_reads_new_ones(value: object) -> None:
    """Old bytes decode with the serde to what json.loads made of them; the serde's bytes
    decode with json.loads to the same value: both directions across the change."""
    old = _old_encode(value)
    assert _same(JSON.decode(old), json.loads(old))
    assert _same(json.loads(JSON.encode(value) or b""), json.loads(old))


@pytest.mark.parametrize("data", [
    b'"a" ', b' "a"', b'"a\\"', b'"\x00"', b'"\x1f"', b'"\x7f"', b'"\xff"', b'"\xed\xa0\x80"',
    b'"a"b"', b'"a""', b'""', b'"', b'"\\u00e9"', b'"\xc3\xa9"', b'"\\ud83d\\ude00"',
    b'"\\x"', b'"\\', b'"\x00\x00\x00', b"-", b"-0", b"0", b"007", b"-01", b"1_000", b"+1",
    b" 1", b"1 ", b"1e5", b"1.0", b"-1.5E-3", b"true", b"false", b"null", b"NaN",
    b"Infinity", b"[1,2]", b'{"a":"b"}', b"", b"\xef\xbb\xbf\"bom\"", b"9" * 5000,
], ids=repr)
def test_json_reads_any_bytes_as_the_json_module_does(data: bytes) -> None:
    """Odd input (whitespace, escapes, control characters, bad UTF-8, surrogates, leading
    zeros, huge integers, other encodings) decodes to json.loads's value, or is refused
    when json.loads refuses it."""
    try:
        wanted = json.loads(data)
    except ValueError:
        with pytest.raises(SerdeError, match="invalid JSON"):
            JSON.decode(data)
    else:
        assert _same(JSON.decode(data), wanted)


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=8))
def test_json_matches_the_json_module_on_any_value(value: object) -> None:
    """Random values (text with any code point, any int or float, nested): the same
    bytes as json.dumps, and json.loads's value back."""
    encoded = JSON.encode(value)
    if value is None:
        assert encoded is None  # None is a tombstone, not "null"
        return
    assert encoded == _old_encode(value)
    assert _same(JSON.decode(encoded), json.loads(_old_encode(value)))


def test_json_refuses_what_the_json_module_refuses() -> None:
    """A value json.dumps cannot write is a SerdeError naming its type, whichever path
    it took (an int too long to print, a set, a circular list)."""
    circular: list[object] = []
    circular.append(circular)
    for value, kind in ((10**5000, "int"), ({1}, "set"), (circular, "list"),
                        ({"k": object()}, "dict")):
        with pytest.raises(SerdeError, match=f"cannot encode {kind}"):
            JSON.encode(value)
