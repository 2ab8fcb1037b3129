"""The small interfaces through which a runner reaches Kafka: an input port (the
consumer), an output port (the producer), and ``KafkaClients``, the pair a
``TopicProcessor`` runs on. ``consumer.py`` and ``producer.py`` implement them with
confluent-kafka; ``kasper_py.testing.InMemoryBroker`` implements them in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kasper_py.kafka.admin import ensure_internal_topics
from kasper_py.message import TopicPartitionKey

if TYPE_CHECKING:
    from kasper_py.config import Config, OutputTopic
    from kasper_py.message import OutgoingRecord

__all__ = ["InputPort", "KafkaClients", "OutputPort", "ProducerPort", "Transactions"]



Rebalance = Callable[[list[TopicPartitionKey]], "dict[TopicPartitionKey, int] | None"]
"""A rebalance callback of group mode: the topic-partitions assigned or revoked."""
EnsureTopics = Callable[["Config", Sequence[str], Sequence["OutputTopic"]], list[str]]
"""Create an app's internal topics that are absent, with the partition count of the
named input topics (``kafka.admin.ensure_internal_topics``); returns those created."""


class OutputPort(Protocol):
    """Where output goes: produced in order per output partition, then acknowledged."""

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        """Hand ``messages`` over for delivery, in order per output partition."""

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        """Return once every message handed over is acknowledged; raise the first
        delivery error. ``waiting`` is called about once a second meanwhile."""

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        """Those of ``topics`` that cannot be produced to, each with why (``does not
        exist``, or the cluster's refusal), asked in a way that never creates a topic.
        The turn asks once per topic and process, before its first message to it."""


class Transactions(Protocol):
    """An output port's transactions (``processing_guarantee="exactly_once"``): every
    message produced between ``begin`` and ``commit`` becomes visible to
    ``read_committed`` readers at once, with the input offsets, or never."""

    def begin(self) -> None:
        """Open the turn's transaction."""

    def add_offsets(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
                    group: object) -> None:
        """Add the input offsets (``note`` as their metadata) for the consumer group
        ``group`` (the consumer's ``group_metadata()``) to the open transaction: they
        are committed with it, or never. It may return before they are added: then
        ``commit`` waits for them and raises what adding them raised."""

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
               group: object) -> None:
        """Add the input offsets as ``add_offsets`` does (none: only those added before)
        and commit the transaction. Raises ``FencedError`` when a newer process took
        over the transactional id."""

    def abort(self) -> bool:
        """Abort the open transaction, if any; True when one was open. Never raises (a
        failed abort is logged: the broker aborts the transaction at its timeout, or
        when the id is taken over)."""


class ProducerPort(OutputPort, Transactions, Protocol):
    """The loop's producer: an output port that can also be closed, and with
    ``exactly_once`` runs one transaction per turn."""

    def init_transactions(self) -> None:
        """Exactly-once: take over this loop's transactional id, fencing any older
        producer with it and aborting its open transaction."""

    def fence(self, transactional_id: str) -> None:
        """Exactly-once: take another loop's ``transactional_id`` over once (a standby
        promoted in place), fencing its producer and aborting its open transaction."""

    def outstanding(self) -> int:
        """How many messages handed over still await their ack; never blocks."""

    def close(self, discard: bool = False) -> None:
        """Deliver what is queued (or, with ``discard``, drop it) and release the client."""


class InputPort(Protocol):
    """The loop's consumer: of a static partition set, or a member of the group in group
    mode; it never commits on its own."""

    assigned: list[TopicPartitionKey]
    from_start: frozenset[str]
    """Topics read from their beginning when nothing is committed (an app's
    repartitions), whatever ``auto_offset_reset`` says."""

    def use(self, config: Config, from_start: Collection[str] = ()) -> None:
        """Read ``config``'s input topics; ``from_start``'s from their beginning."""

    def partition_count(self) -> int:
        """Check the input topics exist, each group read together with one partition
        count; return the partition numbers the loop runs (``topics.task_count``)."""

    def keys(self, partitions: Sequence[int]) -> list[TopicPartitionKey]:
        """Partition numbers ``partitions`` of the input topics that have them, topic by
        topic (``topics.topic_keys``; every input topic before ``partition_count``)."""

    def assign(self, partitions: Sequence[int], below: Mapping[TopicPartitionKey, int] | None = None
               ) -> dict[TopicPartitionKey, int | None]:
        """Assign ``partitions`` of every input topic at their committed offsets, lowered
        to ``below`` where it is lower; return those start offsets (``None``: nothing
        committed, ``auto_offset_reset`` applies)."""

    def assign_more(self, partitions: Sequence[int],
                    below: Mapping[TopicPartitionKey, int] | None = None
                    ) -> dict[TopicPartitionKey, int | None]:
        """Also assign ``partitions``, as ``assign`` does (a standby promoted in place);
        the partitions assigned already keep their positions."""

    def unassign(self, partitions: Sequence[int]) -> None:
        """Stop reading ``partitions`` of every input topic (partitions released in
        place); the others keep their positions."""

    def subscribe(self, on_assign: Rebalance, on_revoke: Rebalance) -> None:
        """Group mode: join the consumer group. ``on_assign`` gets the topic-partitions
        added to this member (and returns start offsets to use instead of the committed
        ones, where lower); ``on_revoke`` those taken away (lost ones included). Both run
        inside ``consume``."""

    def pause(self, keys: Collection[TopicPartitionKey]) -> None:
        """Group mode: read no record of ``keys`` until they are resumed (or revoked).
        Those ``on_assign`` is being told of are paused as soon as they are assigned."""

    def resume(self, starts: Mapping[TopicPartitionKey, int | None]) -> None:
        """Read the paused keys of ``starts`` again, each from its start offset (``None``:
        nothing committed, from where ``from_start`` or ``auto_offset_reset`` points)."""

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch no more records of ``keys`` for now (aligned inputs: as many of them as
        a batch takes are held for the other inputs); each stays positioned after its
        last record read."""

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch the keys of ``keys`` held back again, from where reading stopped (not
        those ``pause`` paused, nor those no longer assigned)."""

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        """Up to ``max_count`` raw records (confluent-kafka ``Message``-shaped)."""

    def transient_error(self, record: Any) -> bool:
        """True when ``record``'s error is one the client recovers from by itself."""

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None = None) -> None:
        """Commit synchronously, with ``note`` as each offset's metadata."""

    def group_metadata(self) -> object:
        """The consumer group's metadata, for ``Transactions.commit``."""


    def committed(self, keys: Iterable[TopicPartitionKey] | None = None
                  ) -> dict[TopicPartitionKey, int | None]:
        """The group's committed next offsets (``None`` where nothing is committed)."""

    def notes(self, keys: Iterable[TopicPartitionKey] | None = None
              ) -> dict[TopicPartitionKey, str | None]:
        """The metadata of the group's committed offsets (the loops' commit notes)."""

    def positions(self) -> dict[TopicPartitionKey, int | None]:
        """Next offset the application will read, per assigned partition, if known."""

    def watermarks(self, key: TopicPartitionKey, cached: bool = False) -> tuple[int, int]:
        """(low, high) watermark of one partition."""

    def open_transactions(self, keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Of ``keys``, those a transaction is still open on (records written, not yet
        committed or aborted)."""

    def close(self) -> None:
        """Leave without committing."""


def _no_step(_step: str) -> None:
    pass


@dataclass
class KafkaClients:
    """The clients one ``TopicProcessor`` runs on. ``on_step`` is called at each step
    boundary of a turn (``kasper_py.steps.BOUNDARIES``); real clients ignore it, the
    in-memory broker injects faults there."""

    consumer: InputPort
    producer: ProducerPort
    on_step: Callable[[str], None] = _no_step
    clock: Callable[[], float] = time.monotonic
    """The clock ``batch_wait`` is measured on. The in-memory broker's moves on by the
    timeout of a consume that finds too little, so its batches close without sleeping."""
    wall_clock: Callable[[], float] = time.time
    """Seconds since the epoch, on which wall-clock timers and tasks run. The in-memory
    broker's is its ``clock`` from the wall time it was made at, so an idle loop on it
    reaches its timers without sleeping."""
    ensure_topics: EnsureTopics = ensure_internal_topics
    """Creates an app's internal topics at start (the cluster's, or the broker's)."""
