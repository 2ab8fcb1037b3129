"""The turn, written once for every runner (the live loop, the Spark task and the
testing driver). Given a decoded ``Batch``, in this order (the order is the guarantee;
the steps are numbered as in topic_processor.py and docs/architecture.md):

0. skip input an effectively-once store already applied (a replayed batch);
   exactly-once: begin the turn's transaction
1. process: the wall-clock timers and tasks due fire; every partition's messages are
   processed (its stream time moved on to the newest event time of its batch, which
   stamps its output), each followed by its stream-time timers the batch made due;
   undecodable input is set aside (dead letters); the topics sent to for the first
   time in this process must exist
2. flush the stores
3. produce the output; while its acks are outstanding the runner may work ahead
   (``meanwhile``: the loop reads its next batch)
4. wait for every ack
5. commit through the runner's ``commit`` (the loop: the input offsets, or with
   exactly-once the transaction with them; the Spark task and the driver have none);
   then the stores see the turn done (local tables apply their writes)
6. the runner reports the turn
With effectively-once stores 3 and 4 come before 2 (exactly-once: 3, 4 and 5), so the
store records offsets whose outputs are visible.

A failure in any step raises a ``KasperError`` naming the uncommitted batch; the
stores drop the turn's buffered writes, the transaction is aborted, and stream times
and schedules go back to where they were (what fired fires again); the runner must
then not commit. A turn may have no input: the loop runs one when a wall-clock timer
or task is due. What a runner does around the turn (polling, Arrow rows and
task reports, an in-memory broker) lives in the runner, never here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from kasper_py.config import Config
from kasper_py.dead_letters import DeadLetter, DeadLetterLimits, bisect_failures, send_aside
from kasper_py.exceptions import (
    KasperError,
    OffsetError,
    ProcessingError,
    SerdeError,
    SimulatedCrash,
    StoreError,
    TopicError,
)
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.ports import OutputPort, Transactions
from kasper_py.message import Message, OutgoingRecord, TopicPartitionKey
from kasper_py.processor import MessageProcessor, ProcessorContext, ProcessorFactory
from kasper_py.sender import Routes, Sender
from kasper_py.stores.base import KeyValueStore, StoreRuntime, StoreSpec
from kasper_py.stores.lifecycle import (
    AppliedInput,
    StoreLifecycle,
    check_effectively_once_alone,
)
from kasper_py.stores.query import Queryable
from kasper_py.time import EventTimeError, Task
from kasper_py.time.keeper import TimeKeeper

__all__ = ["STEPS", "PartitionState", "TurnEngine", "TurnResult"]

_log = structlog.get_logger("kasper_py")
T = TypeVar("T")

STEPS = ("before_process", "after_process", "after_flush", "after_produce", "after_commit")
"""The step boundaries of a turn at which ``TurnEngine``'s ``on_step`` hook is called;
fault injection stops a process there."""
Commit = Callable[[dict[TopicPartitionKey, int]], None]
"""A runner's commit of a turn's next offsets (with exactly-once: of its transaction)."""


@dataclass
class PartitionState:
    """One input partition number's processor and its stores."""

    partition: int
    stores: dict[str, KeyValueStore] = field(default_factory=dict)
    query_tables: dict[str, Queryable] = field(default_factory=dict)
    """What queries read in place of a store (``ProcessorContext.query_tables``)."""
    processor: MessageProcessor | None = None
    factory: ProcessorFactory | None = None
    """What built ``processor``; it builds the next one when the processor is rebuilt."""


@dataclass
class TurnResult:
    """What a completed turn hands back to its runner."""

    next_offsets: dict[TopicPartitionKey, int]
    """The offsets to commit: last offset + 1 per topic-partition of the batch."""
    produced: int
    """Messages the turn handed to the output port (dead letters included)."""
    dead_letters: list[DeadLetter]
    """Input set aside in this turn: undecodable records and messages ``process()``
    failed on (``Config.on_decode_error``, ``Config.on_process_error``)."""
    durations: dict[str, float]
    """Seconds per step: process, flush, produce, read_ahead (the runner's ``meanwhile``),
    commit."""


class TurnEngine:
    """Runs turns over a set of partitions, each with its processor and stores."""

    def __init__(self, config: Config, port: OutputPort, *,
                 commit: Commit | None = None, transactions: Transactions | None = None,
                 waiting: Callable[[], None] | None = None,
                 on_step: Callable[[str], None] | None = None,
                 wall_clock: Callable[[], float] | None = time.time,
                 tasks: Sequence[Task] = (), routes: Routes | None = None) -> None:
        """``transactions`` (exactly-once) wraps every turn in a transaction of ``port``,
        which ``commit`` must commit. ``wall_clock`` (seconds since the epoch) drives
        wall-clock timers and ``tasks``; ``None`` runs neither (the Spark task). Raises
        ``ConfigError`` when the timestamp extractor does not import. ``routes``: an
        app's repartitions and channels, for its senders (``kasper_py.app``)."""
        self.config = config
        self._routes = routes
        self.time = TimeKeeper(config, wall_clock, tasks)
        """Stream time per partition, timers and tasks."""
        self.partitions: dict[int, PartitionState] = {}
        self._port = port
        self._commit = commit or _no_commit
        self._transactions = transactions
        self._waiting = waiting
        self._on_step = on_step or _no_step
        self.aborted = 0
        """Transactions this engine aborted (a turn that failed inside one)."""
        self._applied = AppliedInput(config.name)
        self._committed = False
        """Whether the running turn committed (effectively-once stores: before flushing)."""
        self._next: dict[TopicPartitionKey, int] = {}
        self._outputs_first = False
        self._dead_letter_failures = config.on_process_error == "dead_letter"
        self._limits = DeadLetterLimits(config)
        self._topics_found: set[str] = set()
        """Topics this engine's turns sent to and found to exist: each is asked once."""

    # -- partitions -----------------------------------------------------------------

    def open_partition(self, partition: int, factory: ProcessorFactory,
                       specs: Sequence[StoreSpec], runtime: StoreRuntime) -> PartitionState:
        """Open ``partition``'s stores (restoring them as needed) and build its processor.
        The partition is registered first, so ``close_steps`` covers a half-open one."""
        state = PartitionState(partition, factory=factory)
        self.partitions[partition] = state
        for spec in specs:
            store = self._store_call(spec.name, partition, spec.open, runtime)
            state.stores[spec.name] = store
            for tp, offset in store.applied_offsets().items():
                # the lowest applied offset: skipping less replays, skipping more loses
                self._applied.note(tp, offset)
        check_effectively_once_alone(state.stores)
        self._outputs_first = self._outputs_first or any(
            store.effectively_once for store in state.stores.values())
        self._build_processor(state)
        return state

    def rebuild_processors(self) -> None:
        """Close every processor and build a fresh one on the same stores: after an
        aborted turn, plain Python state is as a restarted process would have it. The old
        instances' timers are cancelled (the new ones schedule theirs); stream times and
        tasks stay as the last committed turn left them."""
        for state in self.partitions.values():
            self._rebuild_processor(state)

    def _rebuild_processor(self, state: PartitionState) -> None:
        if state.processor is not None:
            state.processor.close()
        self.time.clear_timers(state.partition)
        self._build_processor(state)

    def _build_processor(self, state: PartitionState) -> None:
        """The factory's processor for ``state``'s partition, on its stores and clock."""
        assert state.factory is not None  # set by open_partition
        state.processor = state.factory(ProcessorContext(
            state.partition, self.config, dict(state.stores), self.time.clock(state.partition),
            state.query_tables))

    def unrecorded(self, keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Exactly-once with effectively-once stores: the topic-partitions of ``keys``
        for which a store has recorded no applied offset yet (see ``record``)."""
        if self._transactions is None:
            return []
        return [tp for p, _, store in self.stores() if store.effectively_once
                for tp in keys if tp[1] == p and tp not in store.applied_offsets()]

    def record(self, starts: Mapping[TopicPartitionKey, int]) -> None:
        """Record ``starts`` as applied in every effectively-once store lacking them,
        before the first turn. A turn's transaction commits before its store write; if
        a store's first write failed after that, a restart must find where the store
        stands (here) to process the batch again, not the committed offsets past it."""
        for partition, name, store in self.stores():
            mine = {tp: o for tp, o in starts.items() if tp[1] == partition}
            if store.effectively_once and mine:
                self._store_call(name, partition, store.flush, mine)
                for tp, offset in mine.items():
                    self._applied.note(tp, offset)

    def resume_from(self) -> dict[TopicPartitionKey, int]:
        """Exactly-once with an effectively-once store: the input offsets the stores have
        applied. A turn's transaction (outputs and offsets) commits before its store
        flush, so a crash between the two leaves the store behind the committed offsets;
        the runner starts from here where lower, and that input is processed again
        (its outputs twice). Empty otherwise."""
        return dict(self._applied.below) if self._transactions is not None else {}

    def stores(self) -> list[tuple[int, str, StoreLifecycle]]:
        """(partition, name, store) of every open store."""
        return [(p, name, store) for p, state in self.partitions.items()
                for name, store in state.stores.items()]

    def close_partition(self, partition: int) -> list[Callable[[], object]]:
        """Forget ``partition`` (revoked from this process): the steps closing its
        processor, then its stores, for ``close_all``. Every other partition's processor
        and stores stay as they are."""
        state = self.partitions.pop(partition, None)
        if state is None:
            return []
        self.time.forget(partition)
        for tp in [tp for tp in self._next if tp[1] == partition]:
            del self._next[tp]
        self._applied.forget_partition(partition)
        steps: list[Callable[[], object]] = [] if state.processor is None else [
            state.processor.close]
        return steps + [store.close for store in state.stores.values()]

    def close_steps(self) -> list[Callable[[], object]]:
        """Closing every processor, then every store: for ``close_all``."""
        steps: list[Callable[[], object]] = [
            state.processor.close for state in self.partitions.values()
            if state.processor is not None]
        return steps + [store.close for _, _, store in self.stores()]

    # -- the turn -------------------------------------------------------------------

    def run(self, batch: Batch, meanwhile: Callable[[], object] | None = None, *,
            stream_times: Mapping[int, int] | None = None) -> TurnResult:
        """Run one turn over ``batch`` (steps in the module docstring); an empty batch
        runs what is due. ``meanwhile`` is called once, after the last output is handed
        over and before its acks are awaited; whatever it raises fails the turn
        (uncommitted), like any step. ``stream_times`` moves partitions' stream times on
        first, as records would (the testing driver's ``advance_stream_time``)."""
        durations: dict[str, float] = {}
        self._committed = False
        saved = self.time.save()
        try:
            for partition, millis in (stream_times or {}).items():
                self.time.advance(partition, millis)
            produced, letters, next_offsets = self._steps(batch, meanwhile, durations)
        except BaseException as exc:
            self._discard_pending()
            self.time.restore(saved)
            self._failed(exc, batch)
            raise
        self._next.update(next_offsets)
        self._applied.forget(next_offsets)
        self._limits.record(sum(1 for letter in letters if letter.reason == "process"),
                            _input_count(batch))
        # Committed: a local table that fails to apply now is behind its changelog, and
        # its next open reads the difference back.
        self._after_delivery()
        return TurnResult(next_offsets, produced, letters, durations)

    def _steps(self, batch: Batch, meanwhile: Callable[[], object] | None,
               durations: dict[str, float]
               ) -> tuple[int, list[DeadLetter], dict[TopicPartitionKey, int]]:
        """The turn's steps 1 to 7 (the module docstring), each timed in ``durations``:
        the messages produced, the dead letters and the offsets committed."""
        self._check_order(batch)
        if self._applied.below:
            self._applied.drop(batch)
        if self._transactions is not None:
            self._transactions.begin()
        self._on_step("before_process")
        sender, letters = _timed(durations, "process", self._process, batch)
        produced = len(sender)
        self._on_step("after_process")
        next_offsets = batch.next_offsets()
        if self._outputs_first:
            # Effectively-once stores skip replayed input, so its output must be
            # acked (exactly-once: committed) before the store records the offsets.
            _timed(durations, "produce", self._produce, sender.drain())
            if self._transactions is not None:
                _timed(durations, "commit", self._commit, next_offsets)
                self._committed = True
        _timed(durations, "flush", self._flush, next_offsets)
        self._on_step("after_flush")
        _timed(durations, "produce", self._hand_over, sender.drain())
        if meanwhile is not None:
            _timed(durations, "read_ahead", meanwhile)
        _timed(durations, "produce", self._port.wait_for_acks, self._waiting)
        self._on_step("after_produce")
        if not self._committed:
            _timed(durations, "commit", self._commit, next_offsets)
        self._on_step("after_commit")
        return produced, letters, next_offsets

    def _failed(self, exc: BaseException, batch: Batch) -> None:
        """A failed turn (its stores' writes dropped, its time put back): the
        transaction aborted, and ``exc`` told which batch it leaves uncommitted."""
        # a killed process aborts nothing: its successor does
        if (self._transactions is not None and not isinstance(exc, SimulatedCrash)
                and self._transactions.abort()):
            self.aborted += 1
        if isinstance(exc, KasperError) and exc.uncommitted is None and not self._committed:
            exc.uncommitted = batch.describe()
        elif isinstance(exc, KasperError) and self._committed:
            exc.add_note(f"The batch ({batch.describe()}) was committed; the store is "
                         "behind it and the next start processes it again.")

    def _check_order(self, batch: Batch) -> None:
        """Each topic-partition's offsets must go on from the previous turn's."""
        for (topic, partition), offsets in batch.ranges.items():
            previous = self._next.get((topic, partition))
            if previous is not None and offsets.first < previous:
                raise OffsetError(f"{topic}[{partition}] offsets are not increasing: a batch "
                                  f"starts at {offsets.first}, after offset {previous - 1} "
                                  "was processed")

    def _process(self, batch: Batch) -> tuple[Sender, list[DeadLetter]]:
        sender = Sender(self.config.key_decoder, self.config.value_decoder, self._routes)
        self.time.fire_wall_clock(sender)
        letters = [record.dead_letter() for record in batch.undecodable]
        failed = 0
        for partition, messages in batch.by_partition.items():
            if self._dead_letter_failures:
                found = self._settle(partition, messages, batch, sender, failed)
                letters += found
                failed += len(found)
            else:
                self._apply(partition, messages, batch, sender)
        self.time.fire_stream_time(sender)  # moved on with no input (the testing driver)
        sender.timestamp = None  # dead letters are stamped when produced
        if failed:
            self._limits.check(failed, _input_count(batch), batch.describe())
        send_aside(letters, self.config, sender)
        self._check_topics(sender.topics)
        return sender, letters

    def _check_topics(self, topics: set[str]) -> None:
        """Before anything of the turn is produced, the topics it sends to that no turn
        of this engine sent to yet must exist: asked of the output port once each, per
        turn only for new ones. A send never creates a topic, so a typo fails the turn
        here, uncommitted, rather than after ``delivery_timeout`` (or by creating it)."""
        new = topics - self._topics_found
        if not new:
            return
        missing = self._port.missing_topics(new)
        if missing:
            listed = ", ".join(f"{topic!r} ({why})" for topic, why in sorted(missing.items()))
            raise TopicError(
                f"processor {self.config.name!r} sent messages to {listed} on "
                f"{self.config.bootstrap_servers}; nothing of the turn was produced. A send "
                "never creates a topic: create it (a typo?), or declare it in "
                "Config.output_topics and start with `kasper run --create-topics`")
        self._topics_found |= new

    def _apply(self, partition: int, messages: list[Message], batch: Batch,
               sender: Sender) -> None:
        """Process ``partition``'s ``messages`` (its stream time moved on first), then fire
        its stream-time timers due. Raises ``ProcessingError`` when ``process()`` raises,
        or with ``on_process_error="dead_letter"`` ``_ProcessRaisedError`` when it may be a poison
        message's doing (any exception but a ``KasperError`` other than ``SerdeError``)."""
        processor = self.partitions[partition].processor
        assert processor is not None  # built by open_partition
        sender.timestamp = self._stamp(partition, messages, batch)
        try:
            processor.process(messages, sender)
        except Exception as exc:
            library = isinstance(exc, KasperError) and not isinstance(exc, SerdeError)
            if self._dead_letter_failures and not library:
                raise _ProcessRaisedError(exc) from exc
            if isinstance(exc, KasperError):
                raise
            raise ProcessingError.raised(partition, exc, batch.describe(partition)) from exc
        self.time.fire_stream_time(sender, partition)

    def _settle(self, partition: int, messages: list[Message], batch: Batch, sender: Sender,
                failed: int) -> list[DeadLetter]:
        """``on_process_error="dead_letter"``: process ``partition``'s ``messages``; when
        ``process()`` raises, find the messages it fails on alone by bisection and return
        them as dead letters (raising ``DeadLetterLimitError`` past the per-turn or
        per-minute limit, ``failed`` found in this turn already)."""
        error = self._attempt(partition, messages, batch, sender)
        if error is None:
            return []
        _log.warning("kasper.bisecting", processor=self.config.name, partition=partition,
                     messages=len(messages), error=f"{type(error).__name__}: {error}")
        letters: list[DeadLetter] = []

        def found(message: Message, exc: Exception) -> None:
            letters.append(DeadLetter(batch.as_read(message), "process", str(exc),
                                      type(exc).__name__))
            self._limits.check(failed + len(letters), where=batch.describe(partition),
                               partition=partition)

        bisect_failures(messages, error, lambda run: self._attempt(partition, run, batch,
                                                                   sender), found)
        return letters

    def _attempt(self, partition: int, messages: list[Message], batch: Batch,
                 sender: Sender) -> Exception | None:
        """Process ``messages`` of ``partition``; when ``process()`` raises, undo what it
        did (the partition's store writes and output since, its stream time) and
        rebuild its processor, and return the exception."""
        state = self.partitions[partition]
        stores = {name: self._store_call(name, partition, store.savepoint)
                  for name, store in state.stores.items()}
        sent, clock = len(sender), self.time.mark(partition)
        try:
            self._apply(partition, messages, batch, sender)
        except _ProcessRaisedError as failed:
            for name, store in state.stores.items():
                self._store_call(name, partition, store.rollback, stores[name])
            sender.truncate(sent)
            self.time.rollback(partition, clock)
            self._rebuild_processor(state)
            return failed.error
        return None

    def _stamp(self, partition: int, messages: list[Message], batch: Batch) -> int | None:
        """Move the partition's stream time on; the batch's newest event time, which its
        output inherits. A timestamp extractor that fails fails the turn."""
        try:
            return self.time.stamp(partition, messages)
        except KasperError:
            raise
        except EventTimeError as exc:
            raise ProcessingError(f"{exc} ({batch.describe(partition)})",
                                  partition=partition) from exc
        except Exception as exc:
            raise ProcessingError(f"timestamp_extractor raised {type(exc).__name__}: {exc} "
                                  f"({batch.describe(partition)})", partition=partition) from exc

    def _flush(self, next_offsets: dict[TopicPartitionKey, int]) -> None:
        for partition, name, store in self.stores():
            mine = {tp: o for tp, o in next_offsets.items() if tp[1] == partition}
            self._store_call(name, partition, store.flush, mine)

    def _produce(self, messages: list[OutgoingRecord]) -> None:
        self._hand_over(messages)
        self._port.wait_for_acks(self._waiting)

    def _hand_over(self, messages: list[OutgoingRecord]) -> None:
        if messages:
            self._port.produce(messages)

    def _after_delivery(self) -> None:
        for partition, name, store in self.stores():
            self._store_call(name, partition, store.after_delivery)

    def _discard_pending(self) -> None:
        """A failed turn's buffered store writes are dropped, never flushed later."""
        for _, _, store in self.stores():
            store.discard_pending()

    @staticmethod
    def _store_call(name: str, partition: int, method: Callable[..., T], *args: Any) -> T:
        """A store's own error becomes a ``StoreError`` naming the store and partition."""
        try:
            return method(*args)
        except KasperError:
            raise
        except Exception as exc:
            raise StoreError(f"store {name!r} of partition {partition}: "
                             f"{type(exc).__name__}: {exc}") from exc


class _ProcessRaisedError(Exception):
    """``process()`` raised ``error``, which may be a poison message's doing."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _input_count(batch: Batch) -> int:
    """Messages the batch hands to ``process()``."""
    return sum(len(messages) for messages in batch.by_partition.values())


def _timed(durations: dict[str, float], step: str, fn: Callable[..., T], *args: Any) -> T:
    started = time.perf_counter()
    try:
        return fn(*args)
    finally:
        durations[step] = durations.get(step, 0.0) + time.perf_counter() - started


def _no_step(_step: str) -> None:
    pass


def _no_commit(_next_offsets: dict[TopicPartitionKey, int]) -> None:
    pass
