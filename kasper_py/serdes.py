"""Serdes turn Kafka's bytes into Python values and back.

``BYTES`` (the default) passes bytes through untouched; ``STRING`` is UTF-8;
``JSON`` is UTF-8 JSON. Any object with ``encode``/``decode`` (the ``Serde``
protocol) plugs in; one that also has ``for_topic`` (``bound_to``) is asked for a serde
per topic (the registry serdes of ``kasper_py.registry``, whose subjects are per topic).
Errors are ``SerdeError`` naming what failed.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from kasper_py.exceptions import SerdeError

__all__ = [
    "BYTES", "JSON", "STRING", "BytesSerde", "JsonSerde", "Serde", "StringSerde", "bound_to",
    "serde_for",
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
        raise SerdeError(f"bytes serde cannot encode {type(value).__name__}; pass bytes")

    def decode(self, data: bytes | None) -> Any:
        return data


class StringSerde:
    """UTF-8 text. Bytes given to ``encode`` pass through unchanged."""

    name = "str"

    def encode(self, value: Any) -> bytes | None:
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

    Whole numbers (counts, sums: what tables hold most) skip the json module both ways:
    the same bytes, in about a tenth of the time."""

    name = "json"

    def encode(self, value: Any) -> bytes | None:
        if type(value) is int:
            return b"%d" % value
        if value is None or isinstance(value, bytes):
            return value
        try:
            return json.dumps(value, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"json serde cannot encode {type(value).__name__}: {exc}") from exc

    def decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        digits = data[1:] if data[:1] == b"-" else data
        if digits.isdigit() and (digits[0] != 0x30 or len(digits) == 1):  # a JSON integer
            return int(data)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerdeError(f"json serde: invalid JSON: {exc}") from exc


BYTES = BytesSerde()
STRING = StringSerde()
JSON = JsonSerde()

_BY_NAME: dict[str, Serde] = {"bytes": BYTES, "str": STRING, "string": STRING, "json": JSON}


def serde_for(spec: str | Serde) -> Serde:
    """Return the serde named ``spec`` ("bytes", "str", "json"), or ``spec`` itself."""
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
