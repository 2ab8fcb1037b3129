"""Serdes in the schema registry's wire format (a zero byte, the schema id in four
bytes, the payload), on confluent-kafka's own serializers: ``AvroSerde``,
``ProtobufSerde``, ``JsonSchemaSerde``.

The registry's subjects are per topic, and a ``Serde`` knows no topic, so these are
topic serdes: the loop and the ``Sender`` ask ``for_topic(topic)`` once per topic and
use what it returns (cached); a store takes ``serde.for_topic(name)`` (the name its
changelog, or the subject it reads and writes under). A record the registry cannot
decode (wrong magic byte, unknown schema id, a payload that does not fit) is a
``SerdeError`` naming the subject and schema id, handled by ``on_decode_error``; a
registry that does not answer is a ``RegistryUnavailableError``, which fails the turn
instead: the records are fine, the registry is not.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from typing import Any, Literal

from kasper_py._support.names import resolve_name
from kasper_py.exceptions import ConfigError, RegistryUnavailableError, SerdeError
from kasper_py.registry.client import shared_client
from kasper_py.registry.config import RegistryConfig

__all__ = ["FORMATS", "AvroSerde", "JsonSchemaSerde", "ProtobufSerde", "RegistrySerde",
           "registry_serde"]

Field = Literal["key", "value"]


class RegistrySerde(ABC):
    """A topic serde in the registry's wire format. ``encode``/``decode`` work on the
    topic given to ``for_topic`` (or ``topic=``); unbound, they raise ``SerdeError``."""

    name: str

    def __init__(self, registry: RegistryConfig, schema: str | None = None,
                 field: Field = "value", topic: str | None = None) -> None:
        """``schema``: the writer's (and Avro's reader) schema, as ``RegistryConfig``'s
        ``value_schema`` takes it; ``field``: whether this serde is for keys or values
        (the ``-key``/``-value`` subject); ``topic``: the topic bound from the start."""
        self.registry, self.schema, self.field, self.topic = registry, schema, field, topic
        self._bound: dict[str, RegistrySerde] = {}
        self._codec: tuple[Any, Any] | None = None  # (serializer, deserializer), shared
        self._parent = self

    def for_topic(self, topic: str) -> RegistrySerde:
        """This serde bound to ``topic`` (one object per topic, sharing the serializers)."""
        parent = self._parent
        bound = parent._bound.get(topic)
        if bound is None:
            bound = object.__new__(type(self))
            bound.__dict__.update(parent.__dict__, topic=topic)
            parent._bound[topic] = bound
        return bound

    def encode(self, value: Any) -> bytes | None:
        """``value`` in the wire format, its schema registered (or looked up) under the
        topic's subject."""
        if value is None:
            return None
        serializer, _ = self._codecs()
        try:
            return bytes(serializer(value, self._context()))
        except Exception as exc:  # confluent raises several types; all name the cause
            raise self._error("cannot encode", None, exc) from exc

    def decode(self, data: bytes | None) -> Any:
        """The value of wire-format ``data``, read with the schema its id names."""
        if data is None:
            return None
        if len(data) < 5 or data[0] != 0:
            raise SerdeError(f"{self.name} serde: subject {self.subject!r}: not the schema "
                             f"registry's wire format (magic byte {data[:1].hex() or 'none'}"
                             ", expected 00)")
        _, deserializer = self._codecs()
        try:
            return deserializer(data, self._context())
        except Exception as exc:
            raise self._error("cannot decode", int.from_bytes(data[1:5], "big"), exc) from exc

    @property
    def subject(self) -> str:
        """The subject of the bound topic under ``subject_strategy``."""
        record = self.record_name()
        strategy = self.registry.subject_strategy
        if strategy == "record":
            return record or "<record name unknown>"
        topic = self.topic or "<no topic>"
        return f"{topic}-{record}" if strategy == "topic_record" else f"{topic}-{self.field}"

    @abstractmethod
    def record_name(self) -> str | None:
        """The full name of the configured schema's record (``None`` without one)."""

    @abstractmethod
    def _build(self, client: Any, conf: dict[str, Any]) -> tuple[Any, Any]:
        """confluent-kafka's (serializer, deserializer) for this format."""

    def _codecs(self) -> tuple[Any, Any]:
        parent = self._parent
        if parent._codec is None:
            conf = {"auto.register.schemas": self.registry.auto_register,
                    "use.latest.version": self.registry.use_latest_version,
                    "subject.name.strategy": _strategy(self.registry.subject_strategy)}
            parent._codec = parent._build(shared_client(self.registry), conf)
        self._codec = parent._codec
        return parent._codec

    def _context(self) -> Any:
        from confluent_kafka.serialization import (  # noqa: PLC0415
            MessageField,
            SerializationContext,
        )
        if self.topic is None:
            raise SerdeError(f"{self.name} serde is bound to no topic: use "
                             "serde.for_topic(name) (the registry's subjects are per topic)")
        field = MessageField.KEY if self.field == "key" else MessageField.VALUE
        return SerializationContext(self.topic, field)

    def _error(self, doing: str, schema_id: int | None, exc: Exception) -> Exception:
        if isinstance(exc, SerdeError):
            return exc
        where = f"subject {self.subject!r}" + (f", schema id {schema_id}"
                                                if schema_id is not None else "")
        status = getattr(exc, "http_status_code", None)
        if _unreachable(exc, status):
            return RegistryUnavailableError(f"{self.name} serde: {where}: the schema "
                                            f"registry at {self.registry.url} did not "
                                            f"answer{_waited(exc, self.registry)}: "
                                            f"{exc or type(exc).__name__}")
        return SerdeError(f"{self.name} serde {doing} ({where}): {exc}")


def _waited(exc: Exception, registry: RegistryConfig) -> str:
    """How long it was waited for, when the registry's silence (not a refusal) failed it."""
    timed_out = isinstance(exc, TimeoutError) or type(exc).__name__.endswith("Timeout")
    return f" within {registry.timeout:g}s (registry.timeout)" if timed_out else ""


def _unreachable(exc: Exception, status: Any) -> bool:
    """True when the registry itself failed (no answer, or a 5xx), not the record."""
    if isinstance(status, int) and status > 0:
        return status >= 500
    return type(exc).__module__.startswith(("httpx", "httpcore")) or isinstance(
        exc, ConnectionError | TimeoutError)


def _strategy(name: str) -> Any:
    from confluent_kafka.schema_registry import (  # noqa: PLC0415
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )
    return {"topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
            "topic_record": topic_record_subject_name_strategy}[name]


def _schema_text(schema: str | None) -> str | None:
    """``schema`` itself, or the text of the file it names."""
    if schema is None or schema.lstrip().startswith(("{", "[", '"')):
        return schema
    if not os.path.isfile(schema):
        raise ConfigError("registry", f"schema {schema!r} is neither a schema nor a file")
    with open(schema, encoding="utf-8") as file:
        return file.read()


class _TextSchemaSerde(RegistrySerde, ABC):
    """A serde whose schema is text: ``schema`` itself, or the file it names."""

    @property
    def _text(self) -> str | None:
        return _schema_text(self.schema)


class AvroSerde(_TextSchemaSerde):
    """Avro (fastavro, through confluent-kafka's ``AvroSerializer``): dicts in and out.
    The schema (text or file) is the writer's and the reader's: an older writer's
    records are resolved to it."""

    name = "avro"

    def record_name(self) -> str | None:
        parsed = json.loads(self._text) if self._text else None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            return None
        name, namespace = parsed["name"], parsed.get("namespace")
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def _build(self, client: Any, conf: dict[str, Any]) -> tuple[Any, Any]:
        from confluent_kafka.schema_registry.avro import (  # noqa: PLC0415
            AvroDeserializer,
            AvroSerializer,
        )
        text = self._text
        return (AvroSerializer(client, text, conf=conf),
                AvroDeserializer(client, text, conf=_reading(conf)))


class JsonSchemaSerde(_TextSchemaSerde):
    """JSON validated by a JSON Schema (confluent-kafka's ``JSONSerializer``): dicts
    (any JSON value) in and out. Encoding needs the schema; decoding validates against
    it when given, else against the writer's."""

    name = "json_schema"

    def record_name(self) -> str | None:
        parsed = json.loads(self._text) if self._text else None
        title = parsed.get("title") if isinstance(parsed, dict) else None
        return title if isinstance(title, str) else None

    def _build(self, client: Any, conf: dict[str, Any]) -> tuple[Any, Any]:
        from confluent_kafka.schema_registry.json_schema import (  # noqa: PLC0415
            JSONDeserializer,
            JSONSerializer,
        )
        text = self._text
        serializer = JSONSerializer(text, client, conf=conf) if text else _needs_schema(self)
        return serializer, JSONDeserializer(text, schema_registry_client=client,
                                            conf=_reading(conf))


class ProtobufSerde(RegistrySerde):
    """Protocol Buffers (confluent-kafka's ``ProtobufSerializer``): instances of the
    message class (``schema``: ``module:Class``) in and out."""

    name = "protobuf"

    def record_name(self) -> str | None:
        return str(self._message_class().DESCRIPTOR.full_name)

    def _message_class(self) -> Any:
        if self.schema is None or ":" not in self.schema:
            raise ConfigError("registry", f"the protobuf serde needs its message class as "
                              f"'module:Class', got {self.schema!r}")
        return resolve_name(self.schema)

    def _build(self, client: Any, conf: dict[str, Any]) -> tuple[Any, Any]:
        from confluent_kafka.schema_registry.protobuf import (  # noqa: PLC0415
            ProtobufDeserializer,
            ProtobufSerializer,
        )
        message = self._message_class()
        return (ProtobufSerializer(message, client, conf=conf),
                ProtobufDeserializer(message, _reading(conf), schema_registry_client=client))


def _reading(conf: dict[str, Any]) -> dict[str, Any]:
    """What of the serializer's settings a deserializer takes."""
    return {"use.latest.version": conf["use.latest.version"],
            "subject.name.strategy": conf["subject.name.strategy"]}


def _needs_schema(serde: RegistrySerde) -> Any:
    def refuse(value: Any, context: Any) -> bytes:
        raise SerdeError(f"{serde.name} serde: encoding needs the {serde.field}'s schema "
                         f"(registry.{serde.field}_schema)")
    return refuse


FORMATS: dict[str, type[RegistrySerde]] = {
    serde.name: serde for serde in (AvroSerde, ProtobufSerde, JsonSchemaSerde)}
"""The registry serdes by the name ``key_serde``/``value_serde`` take."""


def registry_serde(name: str, registry: RegistryConfig | None, field: Field) -> RegistrySerde:
    """The serde ``name`` (a key of ``FORMATS``) for ``field``, with the schema
    ``registry`` gives that field. ``ConfigError`` without a registry."""
    if registry is None:
        raise ConfigError(f"{field}_serde", f"{name!r} needs a schema registry: set "
                          "Config.registry (a [registry] table with its url)")
    return FORMATS[name](registry, getattr(registry, f"{field}_schema"), field)
