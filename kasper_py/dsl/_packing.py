"""Packing and expanding a DSL stage's repartition records (the frame: ``packed``):
``Packer`` on the writing stage, one Kafka record per destination partition and turn;
``Expander`` on the reading stage, each packed record back into its records, in order,
before the stage's operators see them. Fewer Kafka records a record is what makes the
hop cheaper: producing, acking, consuming and committing cost per Kafka record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

from kasper_py.config import Config
from kasper_py.dsl.packed import (
    FRAME_CAP,
    PACKED,
    PACKED_KEY,
    Columns,
    columns_frames,
    unpack_columns,
)
from kasper_py.exceptions import SerdeError
from kasper_py.kafka.partitioner import murmur2_partitions
from kasper_py.message import Headers, Message, OutgoingRecord
from kasper_py.sender import Sender, SendRecord
from kasper_py.serdes import Column, Serde, bound_to, column_decoder

__all__ = ["Expander", "Packer", "packer_for"]

_KEYS_CACHED = 100_000
"""Keys whose partition a ``Packer`` remembers (a batch's new keys are hashed together,
``murmur2_partitions``); past this many the memory starts afresh."""
_HEADERS = itemgetter(6)
"""A ``Message``'s headers."""
Pick = Callable[[Sequence[Any]], Sequence[Any]]
"""What picks a partition's rows of a column (``_pickers``)."""


class Packer:
    """Packs what a stage sends to a repartition (``Sender.repartition_packed`` hands it
    the records encoded) into one record per destination partition: each key goes to
    the partition the producer would have put it on (murmur2 of its bytes, the
    producer's ``murmur2_random``), so partitioning is unchanged."""

    __slots__ = ("_cap", "_partitions")

    def __init__(self, cap: int = FRAME_CAP) -> None:
        self._cap = cap
        self._partitions: dict[int, dict[bytes, int]] = {}
        """Per partition count, the partition of each key seen lately."""

    def send(self, sender: Sender, name: str, records: Sequence[SendRecord]) -> None:
        """``records`` to repartition ``name``, packed."""
        sender.repartition_packed(name, records, self.pack)

    def pack(self, topic: str, keys: list[bytes], values: list[bytes | None],  # noqa: PLR0917
             stamps: list[int], headers: list[list[tuple[str, bytes | None]] | None] | None,
             partitions: int) -> list[OutgoingRecord]:
        """Encoded records for ``topic`` (of ``partitions`` partitions) as packed
        records, a partition's in the order they were sent, each stamped with the
        newest of its records' timestamps."""
        numbers = self._numbers(keys, partitions)
        packed: list[OutgoingRecord] = []
        for partition, pick in _pickers(numbers):
            if pick is None:  # every record goes to one partition
                mine = columns_frames(keys, values, stamps, headers, self._cap)
                newest = max(stamps)
            else:
                times = pick(stamps)
                mine = columns_frames(pick(keys), pick(values), times,
                                      None if headers is None else pick(headers), self._cap)
                newest = max(times)
            packed += [(topic, None, PACKED_KEY, partition, None, None, newest, [(PACKED, frame)])
                       for frame in mine]
        return packed

    def _numbers(self, keys: list[bytes], partitions: int) -> list[int]:
        """The partition of each of ``keys``: remembered, or hashed with the batch's
        other new keys; a batch of mostly new keys is hashed whole, and remembered only
        while the memory has room (keys that never come back do not churn it)."""
        known = self._partitions.setdefault(partitions, {})
        try:
            return list(map(known.__getitem__, keys))
        except KeyError:  # some key is new
            numbers = list(map(known.get, keys))
        if 2 * numbers.count(None) > len(numbers):
            found = murmur2_partitions(keys, partitions)
            if len(known) < _KEYS_CACHED:
                known.update(zip(keys, found, strict=True))
            return found
        if len(known) > _KEYS_CACHED:
            known.clear()
        new = list(set(keys).difference(known))
        known.update(zip(new, murmur2_partitions(new, partitions), strict=True))
        return list(map(known.__getitem__, keys))


def packer_for(pack: bool | None, config: Config) -> Packer | None:
    """The ``Packer`` of a stage run with ``config``, or ``None`` (plain records):
    ``pack`` when given; by default (``None``) packed when a kasper_py older than
    packing would stop on a packed record rather than skip it (``stops_older_readers``).
    Never with a timestamp extractor: packed records carry the times records had, so a
    stage that reads event time from its records' values gets plain ones."""
    if config.timestamp_extractor is not None:
        return None
    if pack is None:
        pack = stops_older_readers(config)
    return Packer() if pack else None


def stops_older_readers(config: Config) -> bool:
    """Whether a kasper_py older than packing, run with ``config``, stops on a packed
    record, its turn not committed: its key serde refuses ``PACKED_KEY`` (``str``,
    ``json``, a schema registry's; not ``bytes``, which takes any) and a record that
    does not decode stops the loop (``on_decode_error="fail"``, not set aside)."""
    return config.on_decode_error == "fail" and _refuses(config.key_decoder, PACKED_KEY)


def _refuses(serde: Serde, data: bytes) -> bool:
    try:
        serde.decode(data)
    except Exception:
        return True
    return False


def _packed(headers: Headers) -> bool:
    """Whether a record with ``headers`` is packed (its first header says so)."""
    return bool(headers) and headers[0][0] == PACKED


def _pickers(numbers: list[int]) -> list[tuple[int, Pick | None]]:
    """Each partition in ``numbers`` with what picks its rows of a column, in order
    (``None``: every row): a C call a column, not a call a record."""
    first = numbers[0]
    if numbers.count(first) == len(numbers):
        return [(first, None)]
    present = sorted(set(numbers))
    if len(present) <= _MASKED and present[-1] < len(_ONLY):
        marks, everyone = bytes(numbers), range(len(numbers))
        rows = {number: list(compress(everyone, marks.translate(_ONLY[number])))
                for number in present}
    else:
        rows = {number: [] for number in present}
        appends = {number: found.append for number, found in rows.items()}
        for index, number in enumerate(numbers):
            appends[number](index)
    return [(number, _picker(found)) for number, found in rows.items()]


def _picker(rows: list[int]) -> Pick:
    if len(rows) == 1:
        (row,) = rows
        return lambda column: (column[row],)
    return itemgetter(*rows)  # a tuple for two rows or more


_MASKED = 4
"""Partitions a batch goes to at most for ``_pickers`` to find each one's rows by a
C scan of its own (a translated mask: about 30 ns a record each on the 2-core machine,
against about 100 for one Python loop over the rows)."""
_ONLY = [bytes(256)[:number] + b"\x01" + bytes(255 - number) for number in range(256)]
"""For each partition under 256, the ``bytes.translate`` table that marks it 1 and
every other 0."""


class Expander:
    """Expands the packed records of the repartition topics a stage reads into the
    ``Message``s they hold, decoded with the config's serdes, in order; each inner
    message keeps its outer record's topic, partition, offset and timestamp type."""

    __slots__ = ("_decoders", "_key_serde", "_topics", "_value_serde")

    def __init__(self, topics: frozenset[str], key_serde: Any, value_serde: Any) -> None:
        self._topics, self._key_serde, self._value_serde = topics, key_serde, value_serde
        self._decoders: dict[str, tuple[Column, Column]] = {}

    def expand(self, messages: list[Message]) -> list[Message]:
        """``messages`` with each packed one replaced by its records (the same list
        when none is packed)."""
        if (not self._topics or not any(map(_HEADERS, messages))  # no headers: one C scan
                or not any(map(_packed, map(_HEADERS, messages)))):
            return messages
        out: list[Message] = []
        for message in messages:
            if _packed(message.headers) and message.topic in self._topics:
                keys, values, stamps, headers = self._columns(message)
                out += map(tuple.__new__, repeat(Message), zip(
                    repeat(message.topic), repeat(message.partition), repeat(message.offset),
                    keys, values, stamps, repeat(()) if headers is None else headers,
                    repeat(message.timestamp_type)))
            else:
                out.append(message)
        return out

    def records(self, messages: list[Message]) -> list[tuple[Any, Any, int | None, Headers]] | None:
        """The records of ``messages`` of one topic, every one packed, as operators take
        them (no ``Message`` built); ``None`` when some is not packed."""
        if (not self._topics or not messages[0].headers
                or not all(map(_packed, map(_HEADERS, messages)))
                or messages[0].topic not in self._topics):
            return None
        out: list[tuple[Any, Any, int | None, Headers]] = []
        for message in messages:
            keys, values, stamps, headers = self._columns(message)
            out += zip(keys, values, stamps, repeat(()) if headers is None else headers,
                       strict=False)  # repeat() has no end
        return out

    def _columns(self, message: Message) -> Columns:
        """The records packed in ``message``, decoded, timestamps of 0 its own."""
        topic, partition, offset = message.topic, message.partition, message.offset
        try:
            keys, values, stamps, headers = unpack_columns(message.headers[0][1] or b"")
        except ValueError as exc:
            raise SerdeError(f"cannot unpack the packed record {topic}[{partition}] offset "
                             f"{offset}: {exc}; the turn is not committed") from exc
        decode_keys, decode_values = self._decoders_of(topic)
        try:
            keys, values = decode_keys(keys), decode_values(values)
        except SerdeError as exc:
            raise SerdeError(f"cannot decode a record packed in {topic}[{partition}] offset "
                             f"{offset}: {exc}; the turn is not committed") from exc
        if 0 in stamps:
            stamps = [stamp or message.timestamp for stamp in stamps]  # type: ignore[misc]
        return keys, values, stamps, headers

    def _decoders_of(self, topic: str) -> tuple[Column, Column]:
        found = self._decoders.get(topic)
        if found is None:
            found = self._decoders[topic] = (
                column_decoder(bound_to(self._key_serde, topic)),
                column_decoder(bound_to(self._value_serde, topic)))
        return found
