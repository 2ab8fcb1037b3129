"""``TopicProcessor``: the loop. Each turn, in this order (the order is the guarantee):

1. process every partition's batch (``MessageProcessor.process``), then fire the
   timers and tasks that are due
2. flush the state stores
3. produce the buffered output; while its acks are outstanding, read the next batch
   (consume and, once it is full, decode: nothing of it is processed yet)
4. wait for every ack
5. commit the input offsets (last processed + 1), synchronously; with exactly-once,
   commit the turn's transaction with them
6. report the turn (metrics, one log line)

While no input comes, a wall-clock timer or task that falls due gets a turn of its
own, with no input (exactly-once: a transaction of its outputs). A failure in any step
stops the loop before step 5, so the batch is replayed on restart: at-least-once, with
duplicates bounded by one batch; with exactly-once the transaction is aborted, so
nothing of it is ever visible to read_committed readers. The batch read ahead was
never processed and is never committed before its own turn: it is read again too. At
start the loop refuses partitions another loop is running (its commit note is recent),
unless forced; with exactly-once, a loop on the same partition set is fenced instead.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import structlog

from kasper_py._closing import close_all
from kasper_py._gc import paced_for
from kasper_py.batching import Batch, BatchController, Collector, build_batch
from kasper_py.config import Config
from kasper_py.consumer import InputConsumer
from kasper_py.exceptions import (
    AlreadyRunningError,
    CommitError,
    ConsumeError,
    FencedError,
    KasperError,
    ProduceError,
    SimulatedCrash,
    TopicError,
)
from kasper_py.observe import LoopObserver, NoopObserver, TurnStats
from kasper_py.offsets import (
    HEARTBEAT_SECONDS,
    CommitNote,
    OffsetTracker,
    lowered,
    partition_lag,
    running_elsewhere,
)
from kasper_py.ports import KafkaClients
from kasper_py.processor import ProcessorFactory
from kasper_py.producer import OutputProducer
from kasper_py.query._locate import Locator
from kasper_py.query._tables import Tables
from kasper_py.query._web import QueryApp, View
from kasper_py.query.server import QueryServer
from kasper_py.stores.base import KeyValueStore, Scan, StoreRuntime, StoreSpec
from kasper_py.time import Task
from kasper_py.topics import owned_partitions
from kasper_py.turn import TurnEngine

__all__ = ["TopicProcessor"]

_log = structlog.get_logger("kasper_py")
_KAFKA_TROUBLE = (ProduceError, CommitError, ConsumeError, FencedError, KeyboardInterrupt)
_AHEAD_STEP = 0.005
"""Longest a consume waits while reading ahead: acks that arrive meanwhile delay the
commit by at most this much. With ``max_latency``, a fiftieth of it at most."""
_TURN_RETRIES = 5
"""Exactly-once: aborted turns in a row, for errors Kafka calls transient, run again
before the loop stops."""
_RETRY_PAUSE = 0.5
_FENCED_NOTE_WAIT = 5.0
"""Fenced: how long to wait for the note of the loop that took over, to name it."""
_DUE_STEP = 0.001
"""Shortest consume wait while a wall-clock timer or task is due (it then ends the
batch at once)."""
_GROUP_CHECK_SECONDS = 1.0
"""Group mode, ``until_caught_up``: once this member's own partitions are consumed to
their ends, how often it reads the group's committed offsets and every input
partition's end to see whether the group holds any lag."""


class TopicProcessor:
    """Runs one processor name over a static set of input partitions."""

    def __init__(
        self,
        config: Config,
        factory: ProcessorFactory,
        *,
        stores: Sequence[StoreSpec] = (),
        observer: LoopObserver | None = None,
        clients: KafkaClients | None = None,
        force: bool = False,
        tasks: Sequence[Task] = (),
        views: Mapping[str, View] | None = None,
    ) -> None:
        """``clients`` default to confluent-kafka clients built from ``config``; pass
        ``kasper_py.testing.InMemoryBroker(...).clients(config)`` to run with no broker.
        ``force`` starts even when another loop's recent commit note says it is running
        these partitions (by default that raises ``AlreadyRunningError``). ``tasks`` run
        on the wall clock, in turns of this loop (see ``kasper_py.time.Task``).
        ``views`` maps paths to web views (``kasper_py.query.View``) served beside the
        table queries on the metrics server, which ``config.metrics_port`` (or a serving
        ``observer``) must provide. Raises ``ConfigError`` when
        ``config.timestamp_extractor`` does not import."""
        names = [spec.name for spec in stores]
        if len(set(names)) != len(names):
            raise ValueError(f"store names must be unique, got {names}")
        self.config = config
        self._factory = factory
        self._store_specs = list(stores)
        self._owned_observer = observer is None and config.metrics_port is not None
        self._observer: LoopObserver = observer or _default_observer(config)
        real_clients = clients is None
        clients = clients or KafkaClients(InputConsumer(config), OutputProducer(config))
        self._consumer, self._producer = clients.consumer, clients.producer
        self._on_step, self._clock = clients.on_step, clients.clock
        self._force = force
        self._poll_budget_ms = float(config.to_consumer_conf().get("max.poll.interval.ms",
                                                                   300_000))
        self._engine = TurnEngine(
            config, self._producer, commit=self._commit_offsets,
            transactions=self._producer if config.exactly_once else None,
            waiting=self._observer.on_idle, on_step=clients.on_step,
            wall_clock=clients.wall_clock, tasks=tasks)
        self._offsets = OffsetTracker()
        self._collector = Collector(self._consumer.consume, config.batch_size,
                                    config.batch_wait, self._clock)
        self._sizing = (None if config.max_latency is None
                        else BatchController(config.max_latency, config.batch_size))
        """With ``max_latency``: sizes each batch (and its linger) from the last turns."""
        self._ahead_step = (_AHEAD_STEP if config.max_latency is None
                            else min(_AHEAD_STEP, config.max_latency / 50))
        self._resize()
        self._ahead: Batch | KasperError | None = None
        """The next batch, read (or failed to read) while the last turn's acks were
        outstanding."""
        topics = config.input_topics
        self._only_topic = topics[0] if len(topics) == 1 else None
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._loop_thread: int | None = None
        self._shutdown_lock = threading.Lock()
        self._shut = False
        self._started = False
        self._last_commit = time.monotonic()
        self._started_at = time.time()
        self._partition_count = 0
        self._next_group_check = 0.0
        """Group mode, ``until_caught_up``: when (on ``clock``) to look at the group's lag."""
        self._group_lagging: list[tuple[str, int]] = []
        self._endpoint: str | None = None
        self._query_server: QueryServer | None = None
        self.tables = self._serve_queries(views or {}, locate=real_clients)
        """The tables' committed state, for queries from any thread (``kasper_py.query``)."""

    # -- public ---------------------------------------------------------------

    def run_loop(self, until_caught_up: bool = False) -> None:
        """Process batches until ``close()``; with ``until_caught_up``, also return once
        caught up (clients stay open). Caught up, with a static assignment: every
        assigned partition is consumed to its high watermark. In group mode: every
        partition of the input topics is committed to its end by the group, whoever
        holds it; until then the member goes on processing whatever the group assigns
        it (partitions of a killed member come to it once that member's session
        expires).

        Raises a ``KasperError`` subclass when a turn fails; nothing of that batch is
        committed and the processor is closed.
        """
        if self._shut:
            raise KasperError(f"processor {self.config.name!r} is closed")
        self._loop_thread = threading.get_ident()
        self._stopped.clear()
        try:
            self._start()
            with paced_for(self.config.batch_size):
                self._loop(until_caught_up)
            if self._closing.is_set():
                self._shutdown()  # before _stopped is set: close() waits for the clients
        except SimulatedCrash:
            self._shut = True  # a killed process cleans nothing up
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._loop_thread = None
            self._stopped.set()

    def run_until_stopped(self, until_caught_up: bool = False) -> str | None:
        """``run_loop()`` with SIGTERM and SIGINT closing the processor gracefully: the
        batch in hand is finished and committed, then the clients close. A second signal
        stops at once (``KeyboardInterrupt``; that batch is not committed). The previous
        handlers are restored on return.

        Returns the name of the signal that stopped (and closed) the processor, or
        ``None`` when the loop ended on its own (``until_caught_up``; the clients and
        stores stay open, as with ``run_loop``). Call it from the main thread: Python
        runs signal handlers only there.
        """
        if threading.current_thread() is not threading.main_thread():
            raise KasperError(f"processor {self.config.name!r}: run_until_stopped() must be "
                              "called from the main thread, where Python handles signals")
        caught: list[str] = []

        def handle(signum: int, _frame: Any) -> None:
            # only state changes here: logging from a handler could re-enter a stream
            if caught:
                raise KeyboardInterrupt
            caught.append(signal.Signals(signum).name)
            self.close()

        stopping = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, handle) for sig in stopping}
        try:
            self.run_loop(until_caught_up=until_caught_up)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if caught:
            _log.info("kasper.stopped_by_signal", processor=self.config.name, signal=caught[0])
        return caught[0] if caught else None

    def close(self, timeout: float | None = None) -> None:
        """Stop after the batch in hand is committed, then close the clients.

        Safe from another thread (waits up to ``timeout`` for the loop to stop) and
        from a signal handler (returns at once; the loop closes when the turn ends).
        """
        self._closing.set()
        loop_thread = self._loop_thread
        if loop_thread is None:
            self._shutdown()
        elif loop_thread != threading.get_ident():
            self._stopped.wait(timeout)

    def __enter__(self) -> TopicProcessor:
        return self

    def __exit__(self, *_exc: object) -> None:
        """Leaving a ``with`` block closes the processor (see ``close``)."""
        self.close()

    def has_consumed_all(self) -> bool:
        """True when every assigned partition's next offset reached its high watermark
        and no batch read ahead waits to be processed.

        The high watermarks are the consumer's cached ones, which every fetch response
        renews (a round trip only for a partition with none cached yet): a running loop
        checks this after every batch that is not full, at no cost to the broker.
        """
        if not self._consumer.assigned:
            if self.config.group_mode:
                return False  # nothing assigned yet
            self._consumer.assign(self._partitions(self._consumer.partition_count()))
        if self._holding():
            return False
        positions = self._consumer.positions()
        unknown = [tp for tp, pos in positions.items() if pos is None]
        committed = self._consumer.committed(unknown) if unknown else {}
        for tp, consumed_to in positions.items():
            low, high = self._consumer.watermarks(tp, cached=True)
            if high < 0:  # no fetch response yet
                low, high = self._consumer.watermarks(tp)
            position = consumed_to if consumed_to is not None else committed.get(tp)
            if partition_lag(position, low, high, self.config.auto_offset_reset):
                return False
        return True

    def committed_offsets(self) -> dict[tuple[str, int], int | None]:
        """The group's committed next offset per assigned partition, read from the broker."""
        return self._consumer.committed()

    @property
    def assigned(self) -> list[tuple[str, int]]:
        """(topic, partition) pairs this process consumes."""
        return list(self._consumer.assigned)

    # -- queries ----------------------------------------------------------------

    def query(self, table: str, key: Any) -> Any:
        """The committed value of ``key`` in ``table``, from any thread (``Tables.get``).
        Raises ``KeyNotFoundError``, ``UnknownTableError``, or ``NotHereError`` naming the
        instance holding the key's partition."""
        return self.tables.get(table, key)

    def scan(self, table: str, *, prefix: bytes = b"", start: bytes | None = None,
             end: bytes | None = None, limit: int = 100,
             cursor: str | None = None) -> dict[str, Any]:
        """One page of ``table``'s committed pairs over the partitions held here, bounds
        in key-serde bytes (``Tables.scan``); pass its ``cursor`` back for the next."""
        return self.tables.scan(table, Scan(prefix, start, end, cursor, limit))

    @property
    def endpoint(self) -> str | None:
        """The URL this loop answers queries on and announces in its commit notes."""
        return self._endpoint

    def _serve_queries(self, views: Mapping[str, View], *, locate: bool) -> Tables:
        """The tables; served with ``views`` on a query server of their own when
        ``config.query_port`` is set. With ``locate`` (real Kafka clients) they find
        other instances from commit notes."""
        if self.config.query_port is None:
            if views:
                raise ValueError("views are served on the query server: set "
                                 "Config.query_port")
            return Tables(self.config, self._store_specs, self._open_stores)
        server = QueryServer(self.config, self._observer.on_query_rejected)
        self._query_server, self._endpoint = server, server.endpoint
        locator = Locator(self.config, server.endpoint) if locate else None
        tables = Tables(self.config, self._store_specs, self._open_stores, locator)
        server.mount(QueryApp(tables, views, server.endpoint))
        return tables

    def _open_stores(self) -> dict[int, dict[str, KeyValueStore]]:
        """The stores open now, by partition: read from query threads, so copied whole
        (a dict copy is atomic under the GIL) before being walked."""
        return {p: dict(state.stores) for p, state in dict(self._engine.partitions).items()}

    # -- the loop -------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started_at = time.time()
        count = self._partition_count = self._consumer.partition_count()
        self.tables.partition_count = count
        if self.config.group_mode:
            self._join_group()
            return
        partitions = self._partitions(count)
        keys = [(t, p) for t in self.config.input_topics for p in partitions]
        if self.config.exactly_once:
            # First: fences an older loop with this id and aborts its open transaction,
            # so the committed offsets (read with require-stable, which waits on an open
            # transaction's offsets) and the changelogs' committed ends are final. Only
            # a loop with this id is fenced: the same partition set, never another.
            self._producer.init_transactions()
        self._check_not_running(keys)
        # Say at once that these partitions are taken (exactly-once: by whom, for the
        # loop just fenced), before restoring tables takes its time.
        committed = self._consumer.committed(keys)
        self._announce({tp: o for tp, o in committed.items() if o is not None})
        for partition in partitions:
            runtime = StoreRuntime(self.config, partition, self._producer,
                                   self._observer.store_observer())
            self._engine.open_partition(partition, self._factory, self._store_specs, runtime)
        self._record_starts(committed)
        committed = self._consumer.assign(partitions, self._engine.resume_from())
        self._offsets.mark_committed({tp: o for tp, o in committed.items() if o is not None})
        self._started = True
        self._observer.on_start(self._consumer.assigned)
        _log.info("kasper.started", processor=self.config.name, partitions=list(partitions),
                  topics=list(self.config.input_topics), group=self.config.group,
                  processing_guarantee=self.config.processing_guarantee,
                  **({"transactional_id": self.config.transactional_id}
                     if self.config.exactly_once else {}))

    # -- group mode -------------------------------------------------------------------

    def _join_group(self) -> None:
        """Group mode: subscribe; partitions arrive (and leave) through the rebalance
        callbacks, which run inside ``consume``, so between turns: the loop reads no
        batch ahead in this mode, and every turn is committed before the next consume."""
        if self.config.exactly_once:
            self._producer.init_transactions()
        self._consumer.subscribe(self._assigned, self._revoked)
        self._started = True
        self._observer.on_start([])
        conf = self.config.to_consumer_conf()
        _log.info("kasper.started", processor=self.config.name, assignment="group",
                  group_protocol=conf["group.protocol"],
                  assignor=conf.get("group.remote.assignor",
                                    conf.get("partition.assignment.strategy")),
                  topics=list(self.config.input_topics), group=self.config.group,
                  processing_guarantee=self.config.processing_guarantee)

    def _assigned(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group added ``keys``: open the new partitions (restoring their tables)
        and build their processors; partitions already held are left untouched. Returns
        where an effectively-once store is behind the committed offsets."""
        partitions = sorted({p for _, p in keys})
        missing = [(t, p) for p in partitions for t in self.config.input_topics
                   if (t, p) not in keys and (t, p) not in self._consumer.assigned]
        if missing:
            raise TopicError(f"the group assigned partitions without their co-partitioned "
                             f"peers {missing}: use the range assignor (see Config.assignment)")
        started = time.perf_counter()
        for partition in partitions:
            if partition not in self._engine.partitions:
                runtime = StoreRuntime(self.config, partition, self._producer,
                                       self._observer.store_observer())
                self._engine.open_partition(partition, self._factory, self._store_specs,
                                            runtime)
        committed = self._consumer.committed(keys)
        self._record_starts(committed)
        starts = lowered(committed, self._engine.resume_from())
        self._offsets.mark_committed({tp: o for tp, o in starts.items() if o is not None})
        self._observer.on_start(self._consumer.assigned)
        if partitions:
            _log.info("kasper.partitions_assigned", processor=self.config.name,
                      partitions=partitions, seconds=round(time.perf_counter() - started, 3))
        return {tp: o for tp, o in starts.items() if o is not None and o != committed[tp]}

    def _revoked(self, keys: list[tuple[str, int]]) -> None:
        """The group took ``keys`` away. Every processed batch is already committed (no
        consume happens inside a turn), so only records gathered for the next batch are
        dropped (the new owner reads them from the committed offsets); the partitions'
        processors and stores close, the others stay."""
        self._collector.drop(set(keys))
        self._offsets.forget(keys)
        partitions = sorted({p for _, p in keys})
        steps = [step for p in partitions for step in self._engine.close_partition(p)]
        close_all(steps, self.config.name)
        _log.info("kasper.partitions_revoked", processor=self.config.name,
                  partitions=partitions)

    def _record_starts(self, committed: dict[tuple[str, int], int | None]) -> None:
        """Exactly-once with an effectively-once store: where the store has recorded
        nothing, record where the loop starts (the ``committed`` offset, else where
        ``auto_offset_reset`` points), so the store always knows where it stands."""
        unrecorded = self._engine.unrecorded(list(committed))
        if not unrecorded:
            return
        starts = {}
        for tp in unrecorded:
            offset = committed.get(tp)
            if offset is None:
                low, high = self._consumer.watermarks(tp)
                offset = low if self.config.auto_offset_reset == "earliest" else high
            starts[tp] = offset
        self._engine.record(starts)

    def _announce(self, committed: dict[tuple[str, int], int]) -> None:
        """Re-commit the committed offsets with this loop's running note."""
        if committed:
            self._recommit(committed, "running", fail=True)
            self._last_commit = time.monotonic()

    def _check_not_running(self, keys: list[tuple[str, int]]) -> None:
        """Refuse partitions another loop or streaming query is running: its last commit
        note says running (or streaming) and is recent (a loop re-commits at least every
        ``HEARTBEAT_SECONDS``). A note of a process on this host that no longer exists
        does not count (a killed loop). With
        exactly-once, a loop on the same partition set is fenced instead, not refused."""
        notes = [CommitNote.decode(m) for m in self._consumer.notes(keys).values()]
        other = running_elsewhere(self.config, notes)
        if other is None:
            return
        if self.config.exactly_once and other.partitions == self.config.partition_set:
            _log.info("kasper.fencing", processor=self.config.name, other=other.describe(),
                      transactional_id=self.config.transactional_id)
            return
        if self._force:
            _log.warning("kasper.forced_start", processor=self.config.name,
                         other=other.describe())
            return
        who = "a stream (kasper stream)" if other.by_stream else "another loop"
        raise AlreadyRunningError(
            f"processor {self.config.name!r}: {who} is running partitions "
            f"{self.config.partition_set} of {', '.join(self.config.input_topics)} "
            f"(group {self.config.group!r}): {other.describe()}. Both would process and "
            "commit; stop it, or start with force (--force)")

    def _loop(self, until_caught_up: bool) -> None:
        while not self._closing.is_set():
            size = self._collector.size
            batch = self._next_batch()
            if batch.ranges or self._engine.time.due():
                self._turn(batch)  # with no input: for the timers and tasks due
            if not batch.ranges:
                self._observer.on_idle()
                self._heartbeat()
            full = len(batch) >= size
            if until_caught_up and not full and self._caught_up():
                return

    def _caught_up(self) -> bool:
        """``until_caught_up``'s end (see ``run_loop``). In group mode, this member's own
        partitions first, at no cost to the broker; once they are done, the group's lag
        on every input partition, read at most every ``_GROUP_CHECK_SECONDS``."""
        if not self.config.group_mode:
            return self.has_consumed_all()
        if self._consumer.assigned and not self.has_consumed_all():
            return False
        now = self._clock()
        if now < self._next_group_check:
            return False
        self._next_group_check = now + _GROUP_CHECK_SECONDS
        self._commit_past_markers()  # the group's offsets of these partitions reach the end
        lagging = self._group_lag()
        if sorted(lagging) != self._group_lagging:
            self._group_lagging = sorted(lagging)
            if lagging:
                _log.info("kasper.waiting_for_group", processor=self.config.name,
                          group=self.config.group, lag=sum(lagging.values()),
                          partitions=[f"{t}[{p}]" for t, p in self._group_lagging])
        return not lagging

    def _group_lag(self) -> dict[tuple[str, int], int]:
        """The group's lag on each partition of the input topics that has any, read
        from the broker (one committed-offsets request, then each partition's end):
        ``offsets.partition_lag`` of the group's committed offset. Empty when the group
        has processed and committed everything written so far. The consumer reads
        committed offsets as stable ones (``read_committed``): while a transaction holds
        offsets pending (a killed exactly-once member's, until it times out) the read
        waits for it, so the answer is final."""
        keys = [(topic, p) for topic in self.config.input_topics
                for p in range(self._partition_count)]
        committed = self._consumer.committed(keys)
        lags = {}
        for tp in keys:
            behind = partition_lag(committed.get(tp), *self._consumer.watermarks(tp),
                                   self.config.auto_offset_reset)
            if behind:
                lags[tp] = behind
        return lags

    def _next_batch(self) -> Batch:
        ahead, self._ahead = self._ahead, None
        if isinstance(ahead, KasperError):
            raise ahead  # reading it failed: it is this turn's failure, not the last one's
        if ahead is not None:
            return ahead
        wait = self._engine.time.seconds_until_due()
        if wait is None:
            self._collector.gather()
        else:  # a wall-clock timer or task ends the batch early when it falls due
            self._collector.gather(until=self._engine.time.due, step=max(wait, _DUE_STEP))
        return self._decode(self._collector.take())

    def _decode(self, records: list[Any]) -> Batch:
        return build_batch(records, self.config.key_decoder, self.config.value_decoder,
                           self._consumer.transient_error,
                           set_aside=self.config.on_decode_error != "fail",
                           keep_read=self.config.on_process_error == "dead_letter",
                           only_topic=self._only_topic)

    def _read_ahead(self) -> None:
        """While a turn's acks are outstanding, read the next batch: consume until the
        acks are in or the batch is ready, and decode a ready one. A Kafka or decoding
        error is kept for the next turn, which fails with it; this turn goes on."""
        try:
            # With max_latency a batch its linger released is finished after the turn,
            # taking along what arrived until then; a full one is decoded now.
            ready = self._collector.gather(until=self._all_acked, step=self._ahead_step)
            if ready and (self._sizing is None or self._collector.full):
                batch = self._decode(self._collector.take())
                self._ahead = batch if batch.ranges else None  # batch_wait over, nothing read
        except KasperError as exc:
            self._ahead = exc

    def _all_acked(self) -> bool:
        return self._producer.outstanding() == 0

    def _holding(self) -> bool:
        """True while records of the next batch are read and not yet processed."""
        return bool(self._collector.records) or self._ahead is not None

    def _turn(self, batch: Batch) -> None:
        for attempt in range(_TURN_RETRIES + 1):
            try:
                # process, flush, produce, commit (exactly-once: one transaction)
                # group mode reads nothing ahead: a rebalance must find no turn in hand
                ahead = None if self.config.group_mode else self._read_ahead
                aborted = self._engine.aborted
                result = self._engine.run(batch, ahead)
                break
            except KasperError as exc:
                for _ in range(self._engine.aborted - aborted):
                    self._observer.on_transaction("aborted", 0.0)
                if isinstance(exc, FencedError):
                    raise self._fenced(exc) from exc
                if not (self.config.exactly_once and exc.retriable) or attempt == _TURN_RETRIES:
                    raise
                self._retry(exc, attempt + 1)
        if self.config.group_mode:
            self._check_poll_budget(result.durations)
        stats = TurnStats(batch, result.produced, result.durations, *self._progress(),
                          dead_letters=result.dead_letters)
        if self._sizing is not None:
            self._sizing.observe(len(batch), self._behind(stats), sum(result.durations.values()))
            self._resize()
        stats.batch_size_target = self._collector.size
        self._report(stats)

    def _resize(self) -> None:
        """With ``max_latency``: the next batch's size and linger, from the controller."""
        if self._sizing is not None:
            self._collector.size, self._collector.linger = self._sizing.size, self._sizing.linger

    @staticmethod
    def _behind(stats: TurnStats) -> int | None:
        """Records behind the committed offsets (those read ahead included), by the
        cached high watermarks; ``None`` when no partition has one yet."""
        if not stats.high_watermarks:
            return None
        return sum(max(0, high - stats.committed.get(tp, high))
                   for tp, high in stats.high_watermarks.items())

    def _check_poll_budget(self, durations: dict[str, float]) -> None:
        """Group mode: the loop consumes only between turns, so a turn must stay well
        inside the group's poll budget (``max.poll.interval.ms``), or the member is
        dropped and its partitions move. A turn over half the budget is reported."""
        budget = self._poll_budget_ms
        seconds = sum(durations.values())
        if seconds * 1000 > budget / 2:
            _log.warning("kasper.turn_near_poll_budget", processor=self.config.name,
                         turn_seconds=round(seconds, 3), budget_seconds=budget / 1000,
                         hint="lower batch_size, or raise max.poll.interval.ms in "
                              "consumer_overrides")

    def _retry(self, exc: KasperError, attempt: int) -> None:
        """Exactly-once, after a transient abort: nothing of the turn is visible and its
        store writes are dropped; rebuild the processors (plain Python state as after a
        restart) and run the same batch again, read from the committed offsets."""
        _log.warning("kasper.turn_retried", processor=self.config.name, attempt=attempt,
                     of=_TURN_RETRIES, error=str(exc))
        time.sleep(_RETRY_PAUSE * attempt)
        self._engine.rebuild_processors()

    def _fenced(self, exc: FencedError) -> FencedError:
        """The fencing error, naming the partitions and the loop that took them over
        (from its start note, committed in its first transaction)."""
        newer = self._newer_notes()
        who = (max(newer, key=lambda n: n.at).describe() if newer
               else "a process that has not committed yet")
        fenced = FencedError(
            f"processor {self.config.name!r} was fenced: another loop took over partitions "
            f"{self.config.partition_set} of {', '.join(self.config.input_topics)} "
            f"(transactional id {self.config.transactional_id!r}); it is {who}. This loop "
            "committed nothing more and stops", code=exc.code)
        fenced.uncommitted = exc.uncommitted
        return fenced

    def _newer_notes(self) -> list[CommitNote]:
        """Notes of other loops on these partitions; the loop that fenced this one
        commits its note right after, so wait a little for it."""
        deadline = time.monotonic() + _FENCED_NOTE_WAIT
        while True:
            try:
                notes = [CommitNote.decode(m) for m in self._consumer.notes().values()]
            except KasperError:
                return []
            newer = [n for n in notes
                     if n is not None and not n.is_mine() and n.at >= self._started_at]
            if newer or time.monotonic() > deadline:
                return newer
            time.sleep(0.2)

    # -- the steps around the turn --------------------------------------------------

    def _commit_offsets(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """The engine's commit: the input offsets (moved past transaction markers), with
        a running note; with exactly-once, in the turn's transaction, which it commits."""
        if not next_offsets and not self.config.exactly_once:
            return  # a turn of timers and tasks alone: no input to commit
        next_offsets = self._past_markers(next_offsets)
        self._offsets.check(next_offsets)
        self._commit_with_note(next_offsets, "running")
        self._offsets.mark_committed(next_offsets)
        self._last_commit = time.monotonic()

    def _commit_with_note(self, next_offsets: dict[tuple[str, int], int],
                          state: Literal["running", "stopped"], *, own: bool = False) -> None:
        """Commit through the consumer, or exactly-once through a transaction (the turn's,
        or with ``own`` one opened for this commit alone)."""
        note = CommitNote.now(state, self.config.partition_set, self._endpoint).encode()
        if not self.config.exactly_once:
            self._consumer.commit(next_offsets, note)
            return
        started = time.perf_counter()
        try:
            if own:
                self._producer.begin()
            self._producer.commit(next_offsets, note, self._consumer.group_metadata())
        except BaseException:
            if own and self._producer.abort():
                self._observer.on_transaction("aborted", 0.0)
            raise
        self._observer.on_transaction("committed", time.perf_counter() - started)

    def _past_markers(self, next_offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Transaction markers (and, read_committed, aborted records) after a batch's last
        record are never returned, but the consumer's position moves past them. When no
        record was consumed beyond the batch (none is held for the next one) that
        position is safe to commit; it keeps the end of a transactional topic from
        showing a lag that never drains."""
        if self._holding():
            return next_offsets  # read ahead: the position is past unprocessed records
        positions = self._consumer.positions()
        return {tp: max(offset, positions.get(tp) or offset)
                for tp, offset in next_offsets.items()}

    def _heartbeat(self) -> None:
        """Idle: re-commit the offsets now and then (moved past any transaction markers
        read since), so the note shows a live loop."""
        if time.monotonic() - self._last_commit >= HEARTBEAT_SECONDS:
            self._commit_past_markers(refresh=True)

    def _commit_past_markers(self, *, refresh: bool = False) -> None:
        """Idle (every consumed record is committed): re-commit the offsets moved past
        the transaction markers read since; with ``refresh`` also when none moved, for
        a fresh note."""
        committed = self._offsets.all()
        if not committed:
            return
        offsets = self._past_markers(committed)
        if offsets == committed and not refresh:
            return
        self._last_commit = time.monotonic()
        if self._recommit(offsets, "running"):
            self._offsets.mark_committed(offsets)

    def _note_stopped(self) -> None:
        """Re-commit the offsets with a "stopped" note: resets need not wait for it. Not
        past the consumer's position: after a failed turn it is ahead of what was done."""
        committed = self._offsets.all()
        if committed:
            try:
                self._recommit(committed, "stopped")
            except FencedError as exc:  # closing anyway: the newer loop's notes stand
                _log.warning("kasper.note_commit_failed", processor=self.config.name,
                             state="stopped", error=str(exc))

    def _recommit(self, offsets: dict[tuple[str, int], int],
                  state: Literal["running", "stopped"], *, fail: bool = False) -> bool:
        """Commit already-processed ``offsets`` with a fresh note; a failure is logged
        (the next turn's commit reports one that lasts) and returns False, or with
        ``fail`` (and always when fenced) raised."""
        try:
            self._commit_with_note(offsets, state, own=True)
        except FencedError as exc:
            raise self._fenced(exc) from exc
        except KasperError as exc:
            if fail:
                raise
            _log.warning("kasper.note_commit_failed", processor=self.config.name,
                         state=state, error=str(exc))
            return False
        return True

    def _report(self, stats: TurnStats) -> None:
        self._observer.on_turn(stats)
        for (topic, partition), offsets in stats.batch.ranges.items():
            _log.info("kasper.batch", processor=self.config.name, topic=topic,
                      partition=partition, first_offset=offsets.first,
                      last_offset=offsets.last, consumed=offsets.count,
                      turn_produced=stats.produced,
                      **{f"{step}_ms": round(s * 1000, 2) for step, s in stats.durations.items()})

    # -- helpers --------------------------------------------------------------

    def _progress(self) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """Committed offsets and cached high watermarks of the assigned partitions."""
        committed: dict[tuple[str, int], int] = {}
        highs: dict[tuple[str, int], int] = {}
        earliest = self.config.auto_offset_reset == "earliest"
        for tp in self._consumer.assigned:
            offset = self._offsets.committed(*tp)
            low, high = self._consumer.watermarks(tp, cached=True)
            if offset is None and low >= 0 and high >= 0:
                # nothing committed yet: the loop starts there (lag is not "no data")
                offset = low if earliest else high
            if offset is not None:
                committed[tp] = offset
            if high >= 0:
                highs[tp] = high
        return committed, highs

    def _partitions(self, count: int) -> list[int]:
        return owned_partitions(self.config, count)

    def _fail(self, exc: BaseException) -> None:
        self._observer.on_error(exc)
        if isinstance(exc, KasperError):
            _log.error("kasper.stopped", processor=self.config.name, error=str(exc),
                       error_type=type(exc).__name__)
        # Kafka trouble (or an impatient user): no last commit, and queued output of the
        # failed batch is dropped, not waited for; the batch is replayed anyway.
        self._shutdown(kafka_ok=not isinstance(exc, _KAFKA_TROUBLE))

    def _shutdown(self, kafka_ok: bool = True) -> None:
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        if kafka_ok and self._started:
            self._note_stopped()
        steps: list[Any] = []
        if self._query_server is not None:
            steps.append(self._query_server.close)  # before the stores close
        steps += self._engine.close_steps()
        steps += [spec.close for spec in self._store_specs]
        steps += [lambda: self._producer.close(discard=not kafka_ok), self._consumer.close,
                  self._observer.on_stop]
        if self._owned_observer:
            steps.append(getattr(self._observer, "close", lambda: None))
        close_all(steps, self.config.name)
        _log.info("kasper.closed", processor=self.config.name)


def _default_observer(config: Config) -> LoopObserver:
    """Prometheus metrics served on ``config.metrics_port`` when it is set, else none."""
    if config.metrics_port is None:
        return NoopObserver()
    from kasper_py.metrics import observer_for  # noqa: PLC0415 - prometheus-client is optional

    return observer_for(config)
