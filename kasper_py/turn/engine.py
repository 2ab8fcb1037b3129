"""The turn engine (``TurnEngine``), written once for every runner (the live loop, the
Spark task and the testing driver). Given a decoded ``Batch`` it runs the steps of
``steps.STEPS`` in their order (the order is the guarantee):

- before step 1: input an effectively-once store already applied is skipped (a replayed
  batch); exactly-once: the turn's transaction begins;
- 1 process: the wall-clock timers and tasks due fire; every partition's messages are
  processed (its stream time moved on to the newest event time of its batch, which
  stamps its output), each followed by its stream-time timers the batch made due;
  undecodable input and poison messages are set aside (dead letters, ``poison.py``);
  the topics sent to for the first time in this process must exist (``topics.py``);
- 2 flush the stores;
- 3 produce the output; while its acks are outstanding the runner may work ahead
  (``meanwhile``: the loop reads its next batch);
- 4 wait for every ack;
- 5 commit through the runner's ``commit`` (the loop: the input offsets, or with
  exactly-once the transaction with them; the Spark task and the driver have none);
  then the stores see the turn done (local tables apply their writes);
- 6 report: the runner's, from the ``TurnResult``.

With effectively-once stores 3 and 4 come before 2 (exactly-once: 3, 4 and 5), so the
store records offsets whose outputs are visible (``effectively_once.py``).

A failure in any step raises a ``KasperError`` naming the uncommitted batch; the
stores drop the turn's buffered writes, the transaction is aborted, and stream times
and schedules go back to where they were (what fired fires again); the runner must
then not commit. A turn may have no input: the loop runs one when a wall-clock timer
or task is due. What a runner does around the turn (polling, retries, Arrow rows and
task reports, an in-memory broker) lives in the runner, never here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kasper_py.config import Config
from kasper_py.dead_letters import DeadLetter, DeadLetterLimits, send_aside
from kasper_py.exceptions import (
    KasperError,
    OffsetError,
    ProcessingError,
    SerdeError,
    SimulatedCrash,
)
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.ports import OutputPort, Transactions
from kasper_py.message import Message, OutgoingRecord, TopicPartitionKey
from kasper_py.output_topic import value_serdes
from kasper_py.processor import ProcessorContext, ProcessorFactory
from kasper_py.sender import Routes, Sender
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.time import EventTimeError, Task
from kasper_py.time.keeper import TimeKeeper
from kasper_py.turn.effectively_once import EffectivelyOnce, OpenStore
from kasper_py.turn.partitions import PartitionState, store_call
from kasper_py.turn.poison import Bisection, ProcessRaisedError
from kasper_py.turn.topics import TopicCheck

__all__ = ["Commit", "TurnEngine", "TurnResult"]

Commit = Callable[[dict[TopicPartitionKey, int]], None]
"""A runner's commit of a turn's next offsets (with exactly-once: of its transaction)."""


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
    """Seconds per timed step (``steps.TIMED``): process, flush, produce, read_ahead (the
    runner's ``meanwhile``), commit."""


class TurnEngine:
    """Runs turns over a set of partitions, each with its processor and stores."""

    def __init__(self, config: Config, port: OutputPort, *,
                 commit: Commit | None = None, stage: Commit | None = None,
                 transactions: Transactions | None = None,
                 waiting: Callable[[], None] | None = None,
                 on_step: Callable[[str], None] | None = None,
                 wall_clock: Callable[[], float] | None = time.time,
                 tasks: Sequence[Task] = (), routes: Routes | None = None,
                 leading: Callable[[], bool] | None = None) -> None:
        """``transactions`` (exactly-once) wraps every turn in a transaction of ``port``,
        which ``commit`` must commit. ``stage`` gets the turn's offsets once its outputs
        are handed over, before the runner's ``meanwhile`` and the wait for the acks
        (exactly-once starts adding them to the transaction then). ``wall_clock``
        (seconds since the epoch) drives wall-clock timers and ``tasks``; ``None`` runs
        neither (the Spark task).
        ``leading`` says whether this process leads its app's processes now (tasks
        ``on_leader`` run only then; by default it always does). ``on_step`` is called
        at each of ``steps.BOUNDARIES``. Raises ``ConfigError`` when the timestamp
        extractor does not import. ``routes``: an app's repartitions and channels, for
        its senders (``kasper_py.app``)."""
        self.config = config
        self._serdes = (config.key_decoder, config.value_decoder)
        """The key and value serdes, resolved once (a custom one's check costs ~13 µs)."""
        self._output_serdes = value_serdes(config.output_topics)
        """Declared output topics' own value serdes (``OutputTopic.value_serde``)."""
        self._routes = routes
        self.time = TimeKeeper(config, wall_clock, tasks, leading=leading)
        """Stream time per partition, timers and tasks."""
        self.partitions: dict[int, PartitionState] = {}
        self._port = port
        self._commit = commit or _no_commit
        self._stage = stage or _no_commit
        self._transactions = transactions
        self._waiting = waiting
        self._on_step = on_step or _no_step
        self.aborted = 0
        """Transactions this engine aborted (a turn that failed inside one)."""
        self._once = EffectivelyOnce(config.name, exactly_once=transactions is not None)
        self._committed = False
        """Whether the running turn committed (effectively-once stores: before flushing)."""
        self._next: dict[TopicPartitionKey, int] = {}
        self._dead_letter_failures = config.on_process_error == "dead_letter"
        self._limits = DeadLetterLimits(config)
        self._poison = Bisection(config.name, self.time, self._limits, apply=self._apply,
                                 rebuild=self._rebuild_processor)
        self._topics = TopicCheck(config, port)

    # -- partitions -----------------------------------------------------------------

    def open_partition(self, partition: int, factory: ProcessorFactory,
                       specs: Sequence[StoreSpec], runtime: StoreRuntime) -> PartitionState:
        """Open ``partition``'s stores (restoring them as needed) and build its processor.
        The partition is registered first, so ``close_steps`` covers a half-open one."""
        state = PartitionState(partition, factory=factory, observer=runtime.observer)
        self.partitions[partition] = state
        clock = self.time.clock(partition)
        runtime = replace(runtime, stream_time=lambda: clock.stream_time)
        for spec in specs:
            store = store_call(spec.name, partition, spec.open, runtime)
            state.stores[spec.name] = store
            self._once.opened_store(store)
        self._once.opened(state)
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
            state.query_tables, state.observer))

    def unrecorded(self, keys: Sequence[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Exactly-once with effectively-once stores: the topic-partitions of ``keys``
        for which a store has recorded no applied offset yet (see ``record``)."""
        return self._once.unrecorded(self.stores(), keys)

    def record(self, starts: Mapping[TopicPartitionKey, int]) -> None:
        """Record ``starts`` as applied in every effectively-once store lacking them,
        before the first turn (``EffectivelyOnce.record``)."""
        self._once.record(self.stores(), starts)

    def resume_from(self) -> dict[TopicPartitionKey, int]:
        """Exactly-once with an effectively-once store: the input offsets the stores have
        applied, where the runner starts when lower (``EffectivelyOnce.resume_from``).
        Empty otherwise."""
        return self._once.resume_from()

    def stores(self) -> list[OpenStore]:
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
        self._once.forget_partition(partition)
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
        stores = self.stores()  # opened and closed between turns only
        try:
            for partition, millis in (stream_times or {}).items():
                self.time.advance(partition, millis)
            produced, letters, next_offsets = self._steps(batch, meanwhile, durations,
                                                          stores)
        except BaseException as exc:
            self._discard_pending()
            self.time.restore(saved)
            self._failed(exc, batch)
            raise
        self._next.update(next_offsets)
        self._once.committed(next_offsets)
        self._limits.record(_process_letters(letters), _input_count(batch))
        # Committed: a local table that fails to apply now is behind its changelog, and
        # its next open reads the difference back.
        self._after_delivery(stores)
        return TurnResult(next_offsets, produced, letters, durations)

    def _steps(self, batch: Batch, meanwhile: Callable[[], object] | None,
               durations: dict[str, float], stores: list[OpenStore]
               ) -> tuple[int, list[DeadLetter], dict[TopicPartitionKey, int]]:
        """The turn's steps 1 to 5 (``steps.STEPS``; what comes before step 1 first),
        each timed in ``durations``: the messages produced, the dead letters and the
        offsets committed."""
        self._check_order(batch)
        self._once.skip_applied(batch)
        if self._transactions is not None:
            self._transactions.begin()
        self._on_step("before_process")
        # each step's seconds run from the end of the one before (a failed turn's
        # durations are never read)
        started = time.perf_counter()
        sender, letters = self._process(batch)
        started = _lap(durations, "process", started)
        produced = len(sender)
        self._on_step("after_process")
        next_offsets = batch.next_offsets()
        if self._once.outputs_first:
            # Effectively-once stores skip replayed input, so its output must be
            # acked (exactly-once: committed) before the store records the offsets.
            started = self._produce_first(sender, next_offsets, durations)
        self._flush(next_offsets, stores)
        started = _lap(durations, "flush", started)
        self._on_step("after_flush")
        self._hand_over(sender.drain())
        if not self._committed:
            self._stage(next_offsets)
        started = _lap(durations, "produce", started)
        if meanwhile is not None:
            meanwhile()
            started = _lap(durations, "read_ahead", started)
        self._port.wait_for_acks(self._waiting)
        started = _lap(durations, "produce", started)
        self._on_step("after_produce")
        if not self._committed:
            self._commit(next_offsets)
            _lap(durations, "commit", started)
        self._on_step("after_commit")
        return produced, letters, next_offsets

    def _produce_first(self, sender: Sender, next_offsets: dict[TopicPartitionKey, int],
                       durations: dict[str, float]) -> float:
        """Effectively-once stores: the output acked (exactly-once: its transaction
        committed) before the stores flush. Returns when it ended."""
        started = time.perf_counter()
        self._produce(sender.drain())
        started = _lap(durations, "produce", started)
        if self._transactions is not None:
            self._commit(next_offsets)
            self._committed = True
            started = _lap(durations, "commit", started)
        return started

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
        sender = Sender(*self._serdes, self._routes, value_serdes=self._output_serdes)
        self.time.fire_wall_clock(sender)
        letters = [record.dead_letter() for record in batch.undecodable]
        failed = 0
        for partition, messages in batch.by_partition.items():
            if self._dead_letter_failures:
                found = self._poison.settle(self.partitions[partition], messages, batch,
                                            sender, failed)
                letters += found
                failed += len(found)
            else:
                self._apply(partition, messages, batch, sender)
        self.time.fire_stream_time(sender)  # moved on with no input (the testing driver)
        sender.timestamp = None  # dead letters are stamped when produced
        if failed:
            self._limits.check(failed, _input_count(batch), batch.describe())
        send_aside(letters, self.config, sender)
        self._topics.check(sender.topics)
        return sender, letters

    def _apply(self, partition: int, messages: list[Message], batch: Batch,
               sender: Sender) -> None:
        """Process ``partition``'s ``messages`` (its stream time moved on first), then fire
        its stream-time timers due. Raises ``ProcessingError`` when ``process()`` raises,
        or with ``on_process_error="dead_letter"`` ``ProcessRaisedError`` when it may be a
        poison message's doing (any exception but a ``KasperError`` other than
        ``SerdeError``)."""
        processor = self.partitions[partition].processor
        assert processor is not None  # built by open_partition
        sender.timestamp = self._stamp(partition, messages, batch)
        try:
            processor.process(messages, sender)
        except Exception as exc:
            library = isinstance(exc, KasperError) and not isinstance(exc, SerdeError)
            if self._dead_letter_failures and not library:
                raise ProcessRaisedError(exc) from exc
            if isinstance(exc, KasperError):
                raise
            raise ProcessingError.raised(partition, exc, batch.describe(partition)) from exc
        self.time.fire_stream_time(sender, partition)

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

    def _flush(self, next_offsets: dict[TopicPartitionKey, int],
               stores: list[OpenStore]) -> None:
        for partition, name, store in stores:
            mine = {tp: o for tp, o in next_offsets.items() if tp[1] == partition}
            store_call(name, partition, store.flush, mine)

    def _produce(self, messages: list[OutgoingRecord]) -> None:
        self._hand_over(messages)
        self._port.wait_for_acks(self._waiting)

    def _hand_over(self, messages: list[OutgoingRecord]) -> None:
        if messages:
            self._port.produce(messages)

    def _after_delivery(self, stores: list[OpenStore]) -> None:
        for partition, name, store in stores:
            store_call(name, partition, store.after_delivery)

    def _discard_pending(self) -> None:
        """A failed turn's buffered store writes are dropped, never flushed later."""
        for _, _, store in self.stores():
            store.discard_pending()


def _input_count(batch: Batch) -> int:
    """Messages the batch hands to ``process()``."""
    return sum(map(len, batch.by_partition.values()))


def _process_letters(letters: list[DeadLetter]) -> int:
    """Dead letters of messages ``process()`` failed on."""
    return sum(1 for letter in letters if letter.reason == "process") if letters else 0


def _lap(durations: dict[str, float], step: str, started: float) -> float:
    """Add the seconds since ``started`` to ``step``'s; return now."""
    now = time.perf_counter()
    durations[step] = durations.get(step, 0.0) + now - started
    return now


def _no_step(_step: str) -> None:
    pass


def _no_commit(_next_offsets: dict[TopicPartitionKey, int]) -> None:
    pass
