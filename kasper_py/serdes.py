"""Serdes turn Kafka's bytes into Python values and back.

``BYTES`` (the default) passes bytes through untouched; ``STRING`` is UTF-8;
``JSON`` is UTF-8 JSON. Any object with ``encode``/``decode`` (the ``Serde``
protocol) plugs in; one that also has ``for_topic`` (``bound_to``) is asked for a serde
per topic (the registry serdes of ``kasper_py.registry``, whose subjects are per topic).
Errors are ``SerdeError`` naming what failed.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from kasper_py.exceptions import SerdeError

__all__ = [
    "BYTES", "JSON", "STRING", "BytesSerde", "JsonSerde", "Serde", "StringSerde", "bound_to",
    "column_decoder", "column_encoder", "serde_for",
]


@runtime_checkable
class Serde(Protocol):
    """Encodes values to bytes and decodes bytes to values. ``None`` stays ``None``."""

    name: str

    def encode(self, value: Any) -> bytes | None:
        """Return the bytes for ``value``; raise ``SerdeError`` if it cannot."""
        ...

    def decode(self, data: bytes | None) -> Any:
        """Return the value for ``data``; raise ``SerdeError`` if it cannot."""
        ...


class BytesSerde:
    """Bytes in, bytes out. Encoding accepts ``bytes``, ``bytearray`` and ``memoryview``."""

    name = "bytes"

    def encode(self, value: Any) -> bytes | None:
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        hint = (" or declare the str serde (value_serde=\"str\" or key_serde=\"str\", in "
                "Config, a table or the DSL)" if isinstance(value, str) else "")
        raise SerdeError(f"bytes serde cannot encode {type(value).__name__}; pass bytes"
                         + hint)

    def decode(self, data: bytes | None) -> Any:
        return data


class StringSerde:
    """UTF-8 text. Bytes given to ``encode`` pass through unchanged."""

    name = "str"

    def encode(self, value: Any) -> bytes | None:
        if type(value) is str:  # first: what it is given most
            return value.encode()
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        raise SerdeError(f"str serde cannot encode {type(value).__name__}; pass str")

    def decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise SerdeError(f"str serde: invalid UTF-8 at byte {exc.start}") from exc


class JsonSerde:
    """Compact UTF-8 JSON. Bytes given to ``encode`` pass through unchanged.

    The values tables and repartitions hold most (strings, whole numbers, floats, bools)
    skip the json module's Python layers both ways, with the very bytes and values
    ``json.dumps(value, separators=(",", ":"))`` and ``json.loads`` give: a string
    through the C functions the json module itself calls for one (``\\uXXXX`` escapes
    for what is not printable ASCII), a whole number as its digits. A string key costs
    a tenth of ``json.dumps`` that way (docs/stores.md). Anything else goes through one
    ``JSONEncoder`` kept for the purpose, not one built per call as ``json.dumps`` with
    ``separators`` does."""

    name = "json"

    def encode(self, value: Any) -> bytes | None:
        kind = type(value)
        try:
            if kind is int:
                return b"%d" % value
            if kind is str:
                return _json_string(value).encode()
            if value is None or isinstance(value, bytes):
                return value
            if kind is float and value - value == 0.0:  # finite: not NaN nor an infinity
                return repr(value).encode()
            if kind is bool:
                return b"true" if value else b"false"
            return _JSON_ENCODER.encode(value).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"json serde cannot encode {kind.__name__}: {exc}") from exc

    def decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            if data.isdigit():  # a whole number, unless it has a leading zero
                if data[0] != 0x30 or len(data) == 1:
                    return int(data)
            elif data[:1] == b'"':  # a string, as json.loads reads one (or it says why not)
                text = data.decode()
                value, end = _scan_json_string(text, 1)
                if end == len(text):
                    return value
            elif data[:1] == b"-" and data[1:].isdigit() and (data[1] != 0x30 or len(data) == 2):
                return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerdeError(f"json serde: invalid JSON: {exc}") from exc


_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""What ``json.dumps(value, separators=(",", ":"))`` builds on every call (it builds an
encoder whenever an argument is not a default): the same output, built once."""
_json_string = json.encoder.encode_basestring_ascii
"""The JSON text of a ``str`` as the json module writes one (its C function)."""
_scan_json_string: Callable[[str, int], tuple[str, int]] = (
    json.decoder.scanstring)  # type: ignore[attr-defined]  # typeshed leaves it out
"""The string that starts after an opening quote, as the json module reads one (C)."""
_scan_json: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # typeshed types it as a class
"""The JSON value that starts at an index of a text, and where it ends, as ``json.loads``
reads one (its C scanner)."""


BYTES = BytesSerde()
STRING = StringSerde()
JSON = JsonSerde()

_BY_NAME: dict[str, Serde] = {"bytes": BYTES, "str": STRING, "string": STRING, "json": JSON}
_BUILT_IN = frozenset({BytesSerde, StringSerde, JsonSerde})


def serde_for(spec: str | Serde) -> Serde:
    """Return the serde named ``spec`` ("bytes", "str", "json"), or ``spec`` itself."""
    if type(spec) in _BUILT_IN:  # asked every turn: no runtime protocol check (~13 µs)
        return spec  # type: ignore[return-value]  # a built-in serde, by its type
    if isinstance(spec, str):
        try:
            return _BY_NAME[spec]
        except KeyError:
            raise ValueError(f"unknown serde {spec!r}; use one of bytes, str, json") from None
    if isinstance(spec, Serde):
        return spec
    raise ValueError(f"{type(spec).__name__} is not a serde: it needs encode() and decode()")


def bound_to(serde: Serde, topic: str) -> Serde:
    """The serde to use for ``topic``: ``serde.for_topic(topic)`` when it has that
    method (a topic serde: it caches what it returns), else ``serde`` itself. Callers
    ask once per topic (the decoder once per topic-partition of a batch, the ``Sender``
    once per new topic), never per record."""
    for_topic = getattr(serde, "for_topic", None)
    return serde if for_topic is None else serde_for(for_topic(topic))


Column = Callable[[list[Any]], list[Any]]
"""A function of a column (a list of values or of bytes) to the list it encodes or
decodes to."""


def column_encoder(encode: Callable[[Any], bytes | None]) -> Column:
    """A column's encoder, as ``encode`` (a serde's bound ``encode``) with bytes and
    ``None`` passed through, as the ``Sender`` sends them: for a built-in serde, a
    column of str (or, JSON, of int) is encoded by one C loop, not a call a value (a
    column of ints that repeat, each distinct one printed once)."""
    serde = type(getattr(encode, "__self__", None))

    def column(values: list[Any]) -> list[bytes | None]:
        kinds = set(map(type, values))
        if kinds == {str} and serde is StringSerde:
            return list(map(str.encode, values))
        if serde is JsonSerde and kinds == {int}:
            distinct = set(values)
            if 4 * len(distinct) > len(values):
                return list(map(b"%d".__mod__, values))
            printed = {number: b"%d" % number for number in distinct}  # each printed once
            return list(map(printed.__getitem__, values))
        if serde is JsonSerde and kinds == {str}:
            return list(map(str.encode, map(_json_string, values)))
        return [v if type(v) is bytes or v is None else encode(v) for v in values]

    return column


def column_decoder(serde: Serde) -> Column:
    """A column's decoder, the values ``serde.decode`` gives each: for a built-in serde
    one C loop, not a call a value (JSON: the column read as one JSON array when that
    array surely holds exactly the column's values, ``_json_column``). A value that
    does not decode raises ``SerdeError`` naming its place in the column and its bytes."""
    kind = type(serde)
    if kind is BytesSerde:
        return list
    decode = serde.decode

    def each(column: list[Any]) -> list[Any]:
        try:
            return list(map(decode, column))
        except SerdeError:
            for index, data in enumerate(column):
                try:
                    decode(data)
                except SerdeError as exc:
                    raise SerdeError(f"{exc} (value {index} of the column: "
                                     f"{_shown(data)})") from exc
            raise

    def text(column: list[Any]) -> list[Any]:
        if None in column:
            return each(column)
        try:
            return list(map(bytes.decode, column))
        except UnicodeDecodeError:
            return each(column)  # raises, naming the byte

    def json_text(column: list[Any]) -> list[Any]:
        if None in column or b"" in column:
            return each(column)
        found = _json_column(column)
        return each(column) if found is None else found  # each raises for bad JSON

    return text if kind is StringSerde else json_text if kind is JsonSerde else each


def _json_column(column: list[bytes]) -> list[Any] | None:
    """The JSON values of ``column``, or ``None`` when some value is not one JSON text
    alone. When the column's only commas are the joins (one C count tells), the column
    joined and bracketed is read as one array, one C parse: as many items as values
    then means each item is its value (``1,2``, ``[3``, ``4]`` join into three items but
    hold a comma more). Values with commas of their own (objects, arrays, strings with
    commas) are read by the json module's C scanner, each where its value starts, and
    each must end where its value ends: about 1.5 times the one parse, a third of
    decoding each value alone (docs/streams-dsl.md)."""
    joined = b",".join(column)
    try:
        if joined.count(b",") == len(column) - 1:
            found = json.loads(b"[" + joined + b"]")
            return found if len(found) == len(column) else None
        text = joined.decode()
        lengths = (map(len, column) if len(text) == len(joined)  # ASCII: bytes are chars
                   else map(len, map(bytes.decode, column)))
        found, start = [], 0
        for length in lengths:  # each value's item starts and ends where the value does
            value, stop = _scan_json(text, start)
            if stop != start + length:
                return None
            found.append(value)
            start = stop + 1
        return found
    except (ValueError, StopIteration):  # StopIteration: the scanner found no value
        return None


def _shown(data: Any) -> str:
    """``data`` for an error message, cut to 40 bytes."""
    return repr(data[:40]) + ("..." if len(data) > 40 else "") if data is not None else "None"
