"""Drive a ``MessageProcessor`` with lists of messages and inspect what it sent,
with no broker. The driver runs the loop's steps in the loop's order (process,
flush stores, "produce", "commit"), so a processor that passes here behaves the
same way inside ``TopicProcessor``.

    driver = ProcessorDriver(WordCount, value_serde="str")
    driver.process([make_message("lines", "a b a")])
    assert driver.outputs("counts") == [("a", "2"), ("b", "1")]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kasper_py._memory_broker import Commit, Faults, InMemoryBroker
from kasper_py.batching import Batch, OffsetRange
from kasper_py.config import Config
from kasper_py.exceptions import KasperError, ProcessingError
from kasper_py.message import Headers, Message, OutgoingMessage
from kasper_py.processor import MessageProcessor, ProcessorContext, ProcessorFactory
from kasper_py.sender import Sender
from kasper_py.serdes import Serde
from kasper_py.stores.base import KeyValueStore, StoreRuntime, StoreSpec

__all__ = ["Commit", "Faults", "InMemoryBroker", "ProcessorDriver", "make_message"]


def make_message(
    topic: str,
    value: Any,
    key: Any = None,
    *,
    partition: int = 0,
    offset: int | None = None,
    timestamp: int | None = None,
    headers: Headers = (),
) -> Message:
    """A ``Message`` as a processor would receive it (key and value already decoded).

    With ``offset=None`` the driver numbers messages per topic-partition from 0.
    """
    return Message(topic, partition, -1 if offset is None else offset, key, value,
                   timestamp, headers)


class ProcessorDriver:
    """Runs a processor factory over batches in memory and records what it sent."""

    def __init__(
        self,
        factory: ProcessorFactory,
        *,
        config: Config | None = None,
        stores: Sequence[StoreSpec] = (),
        key_serde: str | Serde = "bytes",
        value_serde: str | Serde = "bytes",
    ) -> None:
        self.config = config or Config(
            name="testing", bootstrap_servers="in-memory:0", input_topics=("input",),
            key_serde=key_serde, value_serde=value_serde,
        )
        self._factory = factory
        self._store_specs = list(stores)
        self._processors: dict[int, MessageProcessor] = {}
        self._stores: dict[int, dict[str, KeyValueStore]] = {}
        self._next_offset: dict[tuple[str, int], int] = {}
        self.sent: list[OutgoingMessage] = []
        """Every message sent by committed turns, in order."""
        self.committed: dict[tuple[str, int], int] = {}
        """Next offset per (topic, partition), as the loop would commit it."""

    def process(self, messages: Iterable[Message]) -> list[OutgoingMessage]:
        """Run one turn over ``messages``; return what it sent.

        A processor that raises gets a ``ProcessingError``, as in the loop, and nothing
        of the turn is recorded as sent or committed.
        """
        batch = self._batch(messages)
        sender = Sender(self.config.key_decoder, self.config.value_decoder)
        try:
            for partition, partition_messages in batch.by_partition.items():
                self._process_partition(partition, partition_messages, sender, batch)
        except BaseException:
            self._discard_pending()  # the loop drops a failed turn's writes with its stores
            raise
        self._flush(batch)
        sent = sender.drain()
        self.sent.extend(sent)
        self.committed.update(batch.next_offsets())
        return sent

    def _process_partition(self, partition: int, messages: list[Message], sender: Sender,
                           batch: Batch) -> None:
        try:
            self.processor(partition).process(messages, sender)
        except KasperError as exc:
            exc.uncommitted = batch.describe()
            raise
        except Exception as exc:
            raise ProcessingError.raised(partition, exc, batch.describe(partition)) from exc

    def _discard_pending(self) -> None:
        for stores in self._stores.values():
            for store in stores.values():
                discard = getattr(store, "discard_pending", None)
                if discard is not None:
                    discard()

    def processor(self, partition: int = 0) -> MessageProcessor:
        """The processor instance of ``partition``, built on first use."""
        if partition not in self._processors:
            stores = {spec.name: spec.open(StoreRuntime(self.config, partition))
                      for spec in self._store_specs}
            self._stores[partition] = stores
            self._processors[partition] = self._factory(
                ProcessorContext(partition, self.config, dict(stores)))
        return self._processors[partition]

    def store(self, name: str, partition: int = 0) -> KeyValueStore:
        """The store ``name`` of ``partition``."""
        self.processor(partition)
        return self._stores[partition][name]

    def outputs(self, topic: str | None = None) -> list[tuple[Any, Any]]:
        """(key, value) pairs sent to ``topic`` (or every topic), decoded with the serdes."""
        key_serde, value_serde = self.config.key_decoder, self.config.value_decoder
        return [(None if m.key is None else key_serde.decode(m.key), value_serde.decode(m.value))
                for m in self.sent if topic is None or m.topic == topic]

    def _batch(self, messages: Iterable[Message]) -> Batch:
        batch = Batch()
        for given in messages:
            tp = (given.topic, given.partition)
            message = given if given.offset >= 0 else given._replace(
                offset=self._next_offset.get(tp, 0))
            self._next_offset[tp] = message.offset + 1
            batch.by_partition.setdefault(message.partition, []).append(message)
            offsets = batch.ranges.get(tp)
            if offsets is None:
                batch.ranges[tp] = OffsetRange(message.offset, message.offset)
            else:
                offsets.last, offsets.count = message.offset, offsets.count + 1
        return batch

    def _flush(self, batch: Batch) -> None:
        next_offsets = batch.next_offsets()
        for partition, stores in self._stores.items():
            mine = {tp: o for tp, o in next_offsets.items() if tp[1] == partition}
            for store in stores.values():
                store.flush(mine)
                store.after_delivery()
