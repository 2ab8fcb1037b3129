"""``MessageProcessor``, the class users subclass, and ``ProcessorContext``, what a
factory receives to build the processor of one partition: its stores, and its time
(event time, stream time, timers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, overload

from kasper_py.exceptions import UnknownStoreError
from kasper_py.observability.observe import NOOP_STORE_OBSERVER, StoreObserver
from kasper_py.stores.base import KeyValueStore
from kasper_py.stores.query import Queryable
from kasper_py.time import PartitionClock, Timer, TimerCallback, TimerKind, extractor_for

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["MessageProcessor", "ProcessorContext", "ProcessorFactory"]

S = TypeVar("S", bound=KeyValueStore)


@dataclass(frozen=True)
class ProcessorContext:
    """What the processor of one partition may use: its partition, config, stores and
    time (``event_time``, ``stream_time``, ``schedule``)."""

    partition: int
    config: Config
    stores: Mapping[str, KeyValueStore] = field(default_factory=dict)
    """The partition's state stores by name, as declared on the TopicProcessor."""
    clock: PartitionClock | None = None
    """The partition's stream time and timers, kept by the turn engine (which passes
    it); use the methods below. A context built by hand gets one with no wall clock."""
    query_tables: dict[str, Queryable] = field(default_factory=dict)
    """What queries read in place of the store of the same name: a ``WindowedTable``
    registers its windows here (``kasper_py.windows.table.WindowedQueryable``). The
    turn engine shares the dict with the loop's query path."""
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """Where ``skipped`` reports (the loop's metrics; the turn engine passes them)."""

    def __post_init__(self) -> None:
        if self.clock is None:
            object.__setattr__(self, "clock", PartitionClock(
                self.partition, extractor_for(self.config.timestamp_extractor)))

    @property
    def _clock(self) -> PartitionClock:
        assert self.clock is not None  # set by __post_init__
        return self.clock

    def skipped(self, reason: str, count: int) -> None:
        """Count ``count`` records the processor skipped on purpose for ``reason`` (for
        example the DSL's ``null_key``): ``kasper_messages_skipped_total`` with that
        reason, its topic empty (the records were made inside the processor)."""
        self.observer.on_records_skipped("", self.partition, reason, count)

    def event_time(self, message: Message) -> int | None:
        """``message``'s event time in milliseconds since the epoch: what
        ``Config.timestamp_extractor`` returns for it, else (no extractor, or it returned
        ``None``) its Kafka timestamp; ``None`` when it has neither."""
        return self._clock.event_time(message)

    def stream_time(self) -> int | None:
        """The partition's stream time: the largest event time of its records processed
        so far, the batch in hand included; it never goes back. ``None`` until a record
        sets it: after a restart it starts unknown again, until a record (or a windowed
        table restoring its own, see ``observe_stream_time``) sets it."""
        return self._clock.stream_time

    def observe_stream_time(self, millis: int) -> None:
        """Raise the stream time to ``millis`` when that is later (never lower it): for a
        table that keeps stream time across restarts, to seed it when it opens. Timers
        fire only in turns whose records advance stream time, not on this."""
        self._clock.observe(millis)

    def schedule(self, interval: float, callback: TimerCallback,
                 kind: TimerKind = "stream_time") -> Timer:
        """Call ``callback(timestamp_ms, sender)`` every ``interval`` seconds of ``kind``
        time, inside a turn; return the ``Timer`` (``cancel()`` stops it).

        What the callback sends or writes is committed with its turn, exactly like
        ``process()`` output (at-least-once, or in the turn's transaction); when it, or
        anything later in that turn, fails, nothing of it is committed, and it fires
        again once the turn is run again (a restart, or the exactly-once retry, whose
        rebuilt processor schedules its timers anew). Output sent without a timestamp
        carries ``timestamp_ms``.

        - ``"stream_time"``: due times are the multiples of ``interval`` since the epoch;
          the timer fires right after a batch of this partition moves its stream time to
          or past the due time (so the first batch with a timestamp fires it: its first
          due time is 0), in that turn, with ``timestamp_ms`` the stream time. Never on
          the wall clock, never on records older than the stream time. When stream time
          jumps several intervals it fires once, then waits for the next multiple after
          the stream time (Kafka Streams' punctuation rule).
        - ``"wall_clock"``: first due ``interval`` after scheduling, then every
          ``interval``; it fires at the start of the turn that finds it due (before that
          turn's input is processed), with ``timestamp_ms`` the wall-clock time. While
          no input comes, the loop runs a turn with no input for it; when input keeps
          coming, the batch is cut short when the timer falls due. Runs missed while a
          turn was busy are skipped. The Spark reprocess task has no wall clock: there
          these timers never fire.

        Timers live with the processor instance: they are not kept across restarts;
        schedule them in the processor's ``__init__``.
        """
        return self._clock.schedule(interval, callback, kind)

    @overload
    def store(self, name: str) -> KeyValueStore: ...

    @overload
    def store(self, name: str, kind: type[S]) -> S: ...

    def store(self, name: str, kind: type[KeyValueStore] = KeyValueStore) -> KeyValueStore:
        """Return the store called ``name``; ``UnknownStoreError`` (a ``KeyError``) lists
        the declared ones and how to declare it.

        ``kind`` (``RocksDBStore``, say) types the result for backend-specific calls;
        a store of another class is a ``TypeError``.
        """
        try:
            store = self.stores[name]
        except KeyError:
            declared = ", ".join(map(repr, sorted(self.stores))) or "none"
            raise UnknownStoreError(
                f"no store {name!r} (declared: {declared}): declare it where the processor "
                f"runs: `kasper run ... --stores MODULE:ATTR` (a sequence of StoreSpecs, "
                f"e.g. [RocksDBTable({name!r})]), TopicProcessor(..., stores=[...]), or "
                "an App processor's stores=") from None
        if not isinstance(store, kind):
            raise TypeError(f"store {name!r} is a {type(store).__name__}, "
                            f"not a {kind.__name__}")
        return store


class MessageProcessor(ABC):
    """Processes the batches of one partition number, across every input topic.

    One instance exists per partition, so plain attributes are per-partition state.
    The class is its own factory: the loop calls it with the partition's
    ``ProcessorContext``, which the base keeps as ``self.context``, so a processor
    that needs nothing at start defines ``process`` alone. One that defines
    ``__init__(self, context)`` takes its stores and timers there (calling
    ``super().__init__(context)`` keeps ``self.context`` too).
    """

    context: ProcessorContext
    """The partition's ``ProcessorContext``: its partition, config, stores and time."""

    def __init__(self, context: ProcessorContext | None = None) -> None:
        if context is not None:
            self.context = context

    @abstractmethod
    def process(self, messages: list[Message], sender: Sender) -> None:
        """Handle one batch: every input topic's messages for this partition, grouped
        topic by topic (in the order the topics first arrived), each in offset order.

        Put output with ``sender.send``; it is produced after this returns. Raising
        stops the loop and leaves the batch uncommitted, so it is processed again.
        """

    def close(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Called once when the loop stops; release what the processor holds."""


ProcessorFactory = Callable[[ProcessorContext], MessageProcessor]
