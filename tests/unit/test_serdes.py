"""Serdes: round trips, pass-through of bytes, and errors that say what failed."""

from __future__ import annotations

import json

import pytest

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
    custom = Upper()
    assert serde_for(custom) is custom
    with pytest.raises(ValueError, match="unknown serde 'xml'"):
        serde_for("xml")
    with pytest.raises(ValueError, match="not a serde"):
        serde_for(42)  # type: ignore[arg-type]
