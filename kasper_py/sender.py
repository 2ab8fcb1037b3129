"""``Sender``: where ``process()`` puts output. It only buffers and encodes; the
loop produces the buffer after ``process()`` returns, so a failed turn leaves
nothing half-sent by the processor itself. It also stamps each message with its
output timestamp: the one given, else the one the turn set for what runs now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kasper_py.exceptions import SerdeError
from kasper_py.message import OutgoingMessage, OutgoingRecord
from kasper_py.serdes import BYTES, Serde, bound_to

__all__ = ["Routes", "Sender"]

HeaderInput = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]]


class Routes(Protocol):
    """Where an app's processors send besides topics (``kasper_py.app``): its
    repartitions' topics and its channels."""

    def repartition_topic(self, name: str) -> str:
        """The topic of repartition ``name``; ``ValueError`` when the processor sending
        does not declare it."""

    def to_channel(self, name: str, key: Any, value: Any, timestamp: int | None,
                   headers: tuple[tuple[str, bytes | None], ...]) -> None:
        """Hand one message to channel ``name``'s readers, in this turn."""


class Sender:
    """Buffers output messages, encoding keys and values with the configured serdes."""

    __slots__ = ("_buffer", "_encode_key", "_encode_value", "_routes", "_timestamp",
                 "_topic", "_topics")

    def __init__(self, key_serde: Serde = BYTES, value_serde: Serde = BYTES,
                 routes: Routes | None = None) -> None:
        """``routes``: the app's repartitions and channels, for a processor of an
        ``App`` (the turn engine passes them)."""
        self._routes = routes
        self._encode_key = _encoder(key_serde)
        self._encode_value = _encoder(value_serde)
        self._buffer: list[OutgoingRecord] = []
        self._timestamp = 0  # as an OutgoingRecord holds it: 0 is "when produced"
        self._topics: set[str] = set()
        self._topic: str | None = None
        """The topic of the last send: a run of sends to one topic adds it once."""

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
        if type(value) is not bytes and value is not None:
            value = self._encode_value(topic, value)
        if type(key) is not bytes and key is not None:
            key = self._encode_key(topic, key)
        if type(topic) is not str or not topic:
            raise ValueError(f"send() needs a topic name, got {topic!r}")
        if partition is None:
            partition = -1
        elif type(partition) is not int or partition < 0:
            raise ValueError(f"send() partition must be a non-negative int, got {partition!r}")
        if timestamp is None:
            timestamp = self._timestamp
        elif type(timestamp) is not int or timestamp < 0:
            raise ValueError(f"send() timestamp must be a non-negative int of milliseconds, "
                             f"got {timestamp!r}")
        # the producer's arguments by position (see OutgoingRecord)
        record: OutgoingRecord = (topic, value, key, partition, None, None, timestamp)
        if headers is not None and (pairs := _headers(headers)):
            record = (*record, pairs)
        self._buffer.append(record)
        if topic is not self._topic:  # an identity test per message, a set add per change
            self._topic = topic
            self._topics.add(topic)

    def repartition(self, name: str, value: Any, key: Any, *,
                    headers: HeaderInput | None = None, timestamp: int | None = None) -> None:
        """Send to the app's repartition ``name`` (``kasper_py.app.Repartition``), by
        ``key``: the processor reading it gets the message on the partition ``key``
        hashes to, in a later turn. Raises ``ValueError`` outside an app, for a
        repartition the processor does not declare in its outputs, or for a ``None``
        key (nothing to partition by); otherwise as ``send``."""
        if self._routes is None:
            raise ValueError(f"repartition {name!r}: sender.repartition() is for the "
                             "processors of an App (kasper_py.app); this one runs alone")
        if key is None:
            raise ValueError(f"repartition {name!r} needs a key: records are partitioned "
                             "by it")
        self.send(self._routes.repartition_topic(name), value, key, headers=headers,
                  timestamp=timestamp)

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
            raise ValueError(f"channel() timestamp must be a non-negative int of "
                             f"milliseconds, got {timestamp!r}")
        pairs = tuple(_headers(headers)) if headers is not None else ()
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


def _encoder(serde: Serde) -> Callable[[str, Any], bytes | None]:
    """``encode(topic, value)`` with ``serde``, errors naming the topic. A topic serde
    (``for_topic``) is bound once per topic and the bound serde kept."""
    if not hasattr(serde, "for_topic"):
        encode = serde.encode

        def plain(topic: str, value: Any) -> bytes | None:
            try:
                return encode(value)
            except SerdeError as exc:
                raise SerdeError(f"cannot encode message for topic {topic!r}: {exc}") from exc
        return plain
    bound: dict[str, Callable[[Any], bytes | None]] = {}

    def per_topic(topic: str, value: Any) -> bytes | None:
        encode = bound.get(topic)
        if encode is None:
            encode = bound[topic] = bound_to(serde, topic).encode
        try:
            return encode(value)
        except SerdeError as exc:
            raise SerdeError(f"cannot encode message for topic {topic!r}: {exc}") from exc
    return per_topic


def _headers(headers: HeaderInput) -> list[tuple[str, bytes | None]]:
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
