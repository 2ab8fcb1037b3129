"""``Sender``: where ``process()`` puts output. It only buffers and encodes; the
loop produces the buffer after ``process()`` returns, so a failed turn leaves
nothing half-sent by the processor itself. It also stamps each message with its
output timestamp: the one given, else the one the turn set for what runs now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import is_, itemgetter
from typing import Any, Protocol

from kasper_py.exceptions import SerdeError
from kasper_py.message import OutgoingMessage, OutgoingRecord
from kasper_py.serdes import BYTES, Serde, bound_to, column_encoder

__all__ = ["Routes", "SendRecord", "Sender", "producer_headers"]

HeaderInput = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]]
SendRecord = tuple[Any, Any, "int | None", "HeaderInput | None"]
"""What ``Sender.send_many`` takes: ``(key, value, timestamp, headers)``, the record shape
of ``kasper_py.dsl``'s operators."""
Encode = Callable[[Any], "bytes | None"]
_KEY, _VALUE, _TIME, _HEADERS = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
"""A ``SendRecord``'s parts."""
Pack = Callable[[str, list[bytes], "list[bytes | None]", list[int],
                 "list[list[tuple[str, bytes | None]] | None] | None", int],
                list[OutgoingRecord]]
"""What ``Sender.repartition_packed`` hands encoded records to: (topic, keys, values,
timestamps, headers, partition count) to the records to buffer."""


class Routes(Protocol):
    """Where an app's processors send besides topics (``kasper_py.app``): its
    repartitions' topics and its channels."""

    def repartition_topic(self, name: str) -> str:
        """The topic of repartition ``name``; ``ValueError`` when the processor sending
        does not declare it."""

    def to_channel(self, name: str, key: Any, value: Any, timestamp: int | None,
                   headers: tuple[tuple[str, bytes | None], ...]) -> None:
        """Hand one message to channel ``name``'s readers, in this turn."""

    def repartition_partitions(self, name: str) -> int | None:
        """The partition count of repartition ``name``'s topic, once the runner knows
        it (``None`` before)."""


class Sender:
    """Buffers output messages, encoding keys and values with the configured serdes."""

    __slots__ = ("_buffer", "_encode_key", "_encode_value", "_encoders", "_key_serde",
                 "_routes", "_timestamp", "_topic", "_topics", "_value_serde", "_value_serdes")

    def __init__(self, key_serde: Serde = BYTES, value_serde: Serde = BYTES,
                 routes: Routes | None = None, *,
                 value_serdes: Mapping[str, Serde] | None = None) -> None:
        """``routes``: the app's repartitions and channels, for a processor of an
        ``App`` (the turn engine passes them). ``value_serdes``: the value serde of
        topics that have their own (``OutputTopic.value_serde``), by name."""
        self._routes = routes
        self._key_serde, self._value_serde = key_serde, value_serde
        self._value_serdes = value_serdes or {}
        self._encoders: dict[str, tuple[Encode, Encode]] = {}
        """Per topic sent to: the key and value serdes' ``encode``, bound to the topic
        (``bound_to``: a registry serde's subject is its topic's)."""
        self._encode_key: Encode = key_serde.encode
        self._encode_value: Encode = value_serde.encode
        self._buffer: list[OutgoingRecord] = []
        self._timestamp = 0  # as an OutgoingRecord holds it: 0 is "when produced"
        self._topics: set[str] = set()
        self._topic: str | None = None
        """The topic of the last send, whose encoders ``_encode_key`` and
        ``_encode_value`` are: a run of sends to one topic looks it up once."""

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch given to a message sent without ``timestamp=``.
        The turn sets it before each call into user code (Kafka Streams' rule: output
        inherits the time of what caused it): for ``process()``, the newest event time of
        the partition's batch; for a timer or task, the stream or wall-clock time that
        fired it. ``None``: the producer stamps the time it produces the message."""
        return self._timestamp or None

    @timestamp.setter
    def timestamp(self, value: int | None) -> None:
        self._timestamp = value or 0

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        headers: HeaderInput | None = None,
        *,
        timestamp: int | None = None,
    ) -> None:
        """Buffer one message for ``topic``; bytes pass through, others go through the serde.

        ``partition=None`` lets the producer choose by key (murmur2, like the Java client).
        ``timestamp`` (milliseconds since the epoch) overrides the inherited one (see
        ``Sender.timestamp``). Raises ``SerdeError`` naming the topic when the key or value
        cannot be encoded, ``ValueError`` for a bad topic, partition or timestamp.
        """
        if topic is not self._topic:  # an identity test per message, a look-up per change
            self._switch_to(topic)
        try:
            if type(value) is not bytes and value is not None:
                value = self._encode_value(value)
            if type(key) is not bytes and key is not None:
                key = self._encode_key(key)
            if partition is None:
                partition = -1
            elif type(partition) is not int or partition < 0:
                raise ValueError(f"send() partition must be a non-negative int, "
                                 f"got {partition!r}")
            if timestamp is None:
                timestamp = self._timestamp
            elif type(timestamp) is not int or timestamp < 0:
                raise _timestamp_error("send", timestamp)
            # the producer's arguments by position (see OutgoingRecord)
            record: OutgoingRecord = (topic, value, key, partition, None, None, timestamp)
            if headers is not None and (pairs := producer_headers(headers)):
                record = (*record, pairs)
        except SerdeError as exc:
            raise self._refused(topic, exc) from exc
        except ValueError:
            self._unnote(topic)
            raise
        self._buffer.append(record)

    def send_many(self, topic: str, records: Sequence[SendRecord]) -> None:
        """Buffer ``(key, value, timestamp, headers)`` records for ``topic``, in order: the
        same messages as ``send(topic, value, key, headers=headers, timestamp=timestamp)``
        for each (partitioned by key; a ``None`` timestamp inherits ``Sender.timestamp``;
        empty or ``None`` headers are none), in one Python call, not one a record.
        Raises as ``send``; the records before a refused one stay buffered."""
        if not records:
            return
        if topic is not self._topic:
            self._switch_to(topic)
        encode_key, encode_value, inherited = self._encode_key, self._encode_value, self._timestamp
        append = self._buffer.append
        try:
            for key, value, timestamp, headers in records:
                if timestamp is not None and (type(timestamp) is not int or timestamp < 0):
                    raise _timestamp_error("send_many", timestamp)
                record = (topic,
                          value if type(value) is bytes or value is None else encode_value(value),
                          key if type(key) is bytes or key is None else encode_key(key),
                          -1, None, None, inherited if timestamp is None else timestamp)
                append((*record, producer_headers(headers)) if headers else record)
        except SerdeError as exc:
            raise self._refused(topic, exc) from exc
        except ValueError:
            self._unnote(topic)
            raise

    def encoders(self, topic: str) -> tuple[Encode, Encode]:
        """The key and value encoders of ``topic`` (its serdes' ``encode``, bound to it),
        for a caller that makes the producer's records itself (``send_encoded``): each
        key or value that is not bytes or ``None`` goes through them, as ``send``'s do."""
        encoders = self._encoders.get(topic)
        if encoders is None:
            encoders = self._encoders[topic] = (bound_to(self._key_serde, topic).encode,
                                                self.value_serde(topic).encode)
        return encoders

    def send_encoded(self, topic: str, records: list[OutgoingRecord]) -> None:
        """Buffer ``records`` for ``topic``, made by the caller in the producer's
        positional form (``(topic, value, key, -1, None, None, timestamp)``, keys and
        values bytes or ``None``, encoded with ``encoders``, the timestamp an int, 0 for
        the producer's time; headers, when any, converted by ``producer_headers``), in
        order: the messages ``send_many`` would buffer, with no loop of its own. The
        Sender takes ``records`` over (an empty buffer becomes that list): the caller
        keeps no hold on it. ``ValueError`` for a bad topic name."""
        if not records:
            return
        if topic is not self._topic:
            self._switch_to(topic)
        if self._buffer:
            self._buffer += records
        else:  # the batch's first output: the list as it is, no copy
            self._buffer = records

    def refused(self, topic: str, exc: SerdeError) -> SerdeError:
        """The error to raise when an encoder of ``topic`` (``encoders``) refused a key
        or a value: it names the topic, as ``send``'s does."""
        return self._refused(topic, exc)

    def value_serde(self, topic: str) -> Serde:
        """The serde that encodes values sent to ``topic`` (a topic serde bound to it)."""
        return bound_to(self._value_serdes.get(topic, self._value_serde), topic)

    def _switch_to(self, topic: str) -> None:
        """Sends go to ``topic`` now: check its name, note it, take its encoders."""
        if type(topic) is not str or not topic:
            raise ValueError(f"send() needs a topic name, got {topic!r}")
        self._encode_key, self._encode_value = self.encoders(topic)
        self._topic = topic
        self._topics.add(topic)

    def _refused(self, topic: str, exc: SerdeError) -> SerdeError:
        """The error of a send to ``topic`` its serde refused, naming the topic."""
        self._unnote(topic)
        return SerdeError(f"cannot encode message for topic {topic!r}: {exc}")

    def _unnote(self, topic: str) -> None:
        """A send to ``topic`` was refused: unless a buffered message goes there, it is
        not one of ``topics`` (the turn asks the cluster about those)."""
        if not any(record[0] == topic for record in self._buffer):
            self._topics.discard(topic)
            self._topic = None

    def repartition(self, name: str, value: Any, key: Any, *,
                    headers: HeaderInput | None = None, timestamp: int | None = None) -> None:
        """Send to the app's repartition ``name`` (``kasper_py.app.Repartition``), by
        ``key``: the processor reading it gets the message on the partition ``key``
        hashes to, in a later turn. Raises ``ValueError`` outside an app, for a
        repartition the processor does not declare in its outputs, or for a ``None``
        key (nothing to partition by); otherwise as ``send``."""
        if self._routes is None:
            raise _outside_app(name)
        if key is None:
            raise _no_key(name)
        self.send(self._routes.repartition_topic(name), value, key, headers=headers,
                  timestamp=timestamp)

    def repartition_many(self, name: str, records: Sequence[SendRecord]) -> None:
        """``repartition`` for a batch of ``(key, value, timestamp, headers)`` records, in
        order, as ``send_many`` sends them: the repartition's topic looked up once. Raises
        as ``repartition``, before buffering any, when a record's key is ``None``."""
        if self._routes is None:
            raise _outside_app(name)
        if any(map(is_, map(_KEY, records), repeat(None))):
            raise _no_key(name)
        self.send_many(self._routes.repartition_topic(name), records)

    def repartition_packed(self, name: str, records: Sequence[SendRecord], pack: Pack) -> None:
        """``repartition_many``, the records encoded column by column (keys, values,
        timestamps, headers: ``None`` when none has any) and handed to ``pack`` with
        the repartition's topic and partition count; what it returns is buffered (the
        streams DSL's packed records). As ``repartition_many`` while the count is not
        known. Raises as ``repartition_many``, buffering none of ``records``."""
        if self._routes is None:
            raise _outside_app(name)
        partitions = self._routes.repartition_partitions(name)
        if partitions is None:
            self.repartition_many(name, records)
            return
        keys = list(map(_KEY, records))
        if None in keys:
            raise _no_key(name)
        if not keys:
            return
        topic = self._routes.repartition_topic(name)
        if topic is not self._topic:
            self._switch_to(topic)
        try:
            keys = column_encoder(self._encode_key)(keys)
            values = column_encoder(self._encode_value)(list(map(_VALUE, records)))
        except SerdeError as exc:
            raise self._refused(topic, exc) from exc
        try:
            stamps, headers = self._stamps(records), self._headers_of(records)
        except ValueError:
            self._unnote(topic)
            raise
        self._buffer += pack(topic, keys, values, stamps, headers, partitions)

    def _stamps(self, records: Sequence[SendRecord]) -> list[int]:
        """``records``' timestamps as ``send_many`` sends them (``None``: inherited)."""
        stamps = list(map(_TIME, records))
        kinds = set(map(type, stamps))
        if kinds != {int} and type(None) in kinds:
            stamps = [self._timestamp if t is None else t for t in stamps]
            kinds = set(map(type, stamps))
        if kinds != {int} or min(stamps) < 0:
            raise _timestamp_error("send_many", next(
                t for t in stamps if type(t) is not int or t < 0))
        return stamps

    @staticmethod
    def _headers_of(records: Sequence[SendRecord]
                    ) -> list[list[tuple[str, bytes | None]] | None] | None:
        """``records``' headers as the producer takes them; ``None`` when none has any."""
        if not any(map(_HEADERS, records)):
            return None
        return [producer_headers(h) if h else None for h in map(_HEADERS, records)]

    def channel(self, name: str, value: Any, key: Any = None, *,
                headers: HeaderInput | None = None, timestamp: int | None = None) -> None:
        """Hand ``key``/``value`` as they are (no serde) to the readers of the app's
        channel ``name`` (``kasper_py.app.Channel``), on this partition, in this turn:
        they get a ``Message`` whose topic is the channel's name and whose offset counts
        the channel's messages in the turn. Only from ``process()``; raises
        ``ValueError`` outside an app or for a channel the processor does not declare
        in its outputs."""
        if self._routes is None:
            raise ValueError(f"channel {name!r}: sender.channel() is for the processors of "
                             "an App (kasper_py.app); this one runs alone")
        if timestamp is None:
            timestamp = self._timestamp or None
        elif type(timestamp) is not int or timestamp < 0:
            raise _timestamp_error("channel", timestamp)
        pairs = tuple(producer_headers(headers)) if headers is not None else ()
        self._routes.to_channel(name, key, value, timestamp, pairs)

    @property
    def messages(self) -> list[OutgoingMessage]:
        """The buffered messages, in the order they were sent."""
        return [OutgoingMessage.of(record) for record in self._buffer]

    @property
    def topics(self) -> set[str]:
        """The topics of the buffered messages: the turn checks those it has not seen
        yet exist before producing anything (see ``TurnEngine``)."""
        return self._topics

    def __len__(self) -> int:
        return len(self._buffer)

    def truncate(self, length: int) -> None:
        """Drop every message sent after the first ``length``: the turn undoes a
        partition's output this way when ``process()`` raised on it
        (``Config.on_process_error="dead_letter"``)."""
        del self._buffer[length:]
        self._topics = {record[0] for record in self._buffer}
        self._topic = None

    def drain(self) -> list[OutgoingRecord]:
        """Return the buffer (``OutgoingRecord``s) and start a new one."""
        buffered, self._buffer = self._buffer, []
        self._topics, self._topic = set(), None
        return buffered


def _timestamp_error(call: str, timestamp: object) -> ValueError:
    return ValueError(f"{call}() timestamp must be a non-negative int of milliseconds, "
                      f"got {timestamp!r}")


def _outside_app(name: str) -> ValueError:
    return ValueError(f"repartition {name!r}: sender.repartition() is for the processors of "
                      "an App (kasper_py.app); this one runs alone")


def _no_key(name: str) -> ValueError:
    return ValueError(f"repartition {name!r} needs a key: records are partitioned by it")


def producer_headers(headers: HeaderInput) -> list[tuple[str, bytes | None]]:
    """``headers`` as the producer takes them: a list of (name, bytes or None)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    result = []
    for name, value in pairs:
        if not isinstance(name, str):
            raise ValueError(f"header names must be str, got {name!r}")
        if value is not None and not isinstance(value, bytes | str):
            raise ValueError(f"header {name!r} must be bytes, str or None, "
                             f"got {type(value).__name__}")
        result.append((name, value.encode() if isinstance(value, str) else value))
    return result
