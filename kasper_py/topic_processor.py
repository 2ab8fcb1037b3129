"""``TopicProcessor``: the loop, composed of parts chosen once at start (``loop/``). It
reads a batch and runs its turn, the steps of ``kasper_py.steps.STEPS`` (numbered there
and in docs/guarantees.md), reading the next batch while the acks are outstanding. A
failure before step 5 leaves the batch uncommitted, replayed on restart (the batch read
ahead too). At start the loop refuses partitions another loop is running, unless
forced; with exactly-once a loop on the same partition set is fenced instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from kasper_py._support.closing import close_all
from kasper_py._support.gc import paced_for
from kasper_py.app import App, Plan, plan_for
from kasper_py.config import Config
from kasper_py.exceptions import KasperError, SimulatedCrash
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.producer import OutputProducer
from kasper_py.loop.assignment import assignment_for
from kasper_py.loop.committer import committer_for
from kasper_py.loop.leader import election_for
from kasper_py.loop.lifecycle import Lifecycle, kafka_usable_after
from kasper_py.loop.partitions import Partitions
from kasper_py.loop.prefetch import Prefetcher
from kasper_py.loop.progress import consumed_all, report, turn_stats
from kasper_py.loop.promotion import promotions_for
from kasper_py.loop.servers import LoopServers, stage_counts
from kasper_py.loop.signals import closing_on_signals
from kasper_py.loop.standby import standbys_for
from kasper_py.loop.turns import turns_for
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import LoopObserver, StoreObserver
from kasper_py.observability.tracing import tracing_for
from kasper_py.processor import ProcessorFactory
from kasper_py.query import View
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import Scan
from kasper_py.time import Task
from kasper_py.turn import TurnEngine

__all__ = ["TopicProcessor"]

_log = structlog.get_logger("kasper_py")


class TopicProcessor:
    """Runs one processor name over its input partitions. Composes parts chosen once at
    start (``kasper_py.loop``): a committer (offsets or the transaction; commit notes,
    fencing), the turns (retried under exactly-once), an assignment (static or group),
    a prefetcher, the HTTP servers and, for leader-only tasks, a leader election."""

    def __init__(self, config: Config, factory: ProcessorFactory | App, *,
                 stores: Sequence[StoreSpec] = (), observer: LoopObserver | None = None,
                 store_observer: StoreObserver | None = None,
                 clients: KafkaClients | None = None, force: bool = False,
                 tasks: Sequence[Task] = (), views: Mapping[str, View] | None = None,
                 tracer_provider: object | None = None) -> None:
        """``factory`` builds each partition's processor; an ``App`` runs several
        (``kasper_py.app``). ``clients`` default to confluent-kafka clients built from
        ``config``; ``kasper_py.testing.InMemoryBroker(...).clients(config)`` has none.
        ``force`` starts even when another loop's recent commit note says it is running
        these partitions (by default that raises ``AlreadyRunningError``). ``tasks`` run
        on the wall clock, in turns of this loop (see ``kasper_py.time.Task``). ``views``
        maps paths to web views (``kasper_py.query.View``) served beside the tables on
        the query server (``config.query_port``). With no ``observer``, metrics are served
        on ``config.metrics_port`` when set; ``store_observer`` also hears the stores. An
        OpenTelemetry ``tracer_provider`` (else ``Config.tracing``'s) traces every turn
        (docs/operations.md). ``ConfigError``: the extractor does not import."""
        self._plan = plan = plan_for(factory, config, stores=stores, tasks=tasks)
        self.config, self._store_specs, self._life = plan.config, plan.stores, Lifecycle()
        config = plan.config
        self._servers = LoopServers(config, observer, store_observer)
        self._observer = observer = self._servers.observer
        real_clients = clients is None
        clients = clients or KafkaClients(InputConsumer(config), OutputProducer(config))
        self._consumer, self._producer = clients.consumer, clients.producer
        self._consumer.use(config, [topic.name for topic in plan.internal])
        self._prefetcher = Prefetcher(config, clients, [topic.name for topic in plan.internal])
        _watch(observer, plan, self._prefetcher)
        self._committer = committer = committer_for(
            config, clients, observer, holding=self._prefetcher.holding,
            endpoint=lambda: self._servers.endpoint,
            warm=lambda: self._standbys.partitions, force=force)
        self._tracing = tracing = tracing_for(config, tracer_provider)
        self._election = election_for(config, plan.tasks, observer, kafka=real_clients)
        self._engine = engine = TurnEngine(
            config, tracing.port(clients.producer), commit=committer.commit,
            stage=committer.stage, transactions=committer.transactions, waiting=observer.on_idle,
            on_step=tracing.on_step(clients.on_step), wall_clock=clients.wall_clock,
            tasks=plan.tasks, routes=plan.routes, leading=self._election.leading)
        partitions = Partitions(config, clients, engine, factory=plan.factory,
                                stores=plan.stores, store_observer=observer.store_observer)
        self._standbys = standbys_for(config, plan.stores, observer.store_observer())
        self._promotions = promotions_for(config)
        self._assignment = assignment_for(config, clients, partitions=partitions,
                                          committer=committer, prefetcher=self._prefetcher,
                                          observer=observer, standbys=self._standbys,
                                          promotions=self._promotions)
        self._servers.serve_admin(self._promotions)
        self._ensure_topics = clients.ensure_topics
        self._turns = turns_for(  # a group member reads nothing ahead
            config, engine, committer, observer, tracing=tracing,
            meanwhile=self._prefetcher.read_ahead if self._assignment.reads_ahead else None,
            repartitions=plan.internal if real_clients else ())
        self.tables = self._servers.serve_tables(
            self._store_specs, engine.partitions, views or {}, locate=real_clients,
            partition_count=self._assignment.partition_count, warm=self._standbys.queryable,
            stage_count=stage_counts(plan.store_topics(), self._consumer.keys,
                                     self._assignment.partition_count))
        """The tables' committed state, for queries from any thread (``kasper_py.query``)."""

    def run_loop(self, until_caught_up: bool = False) -> None:
        """Process batches until ``close()``; with ``until_caught_up``, also return once
        caught up (clients stay open): static, every assigned partition consumed to its
        high watermark; in group mode, every partition of the input topics committed to
        its end by the group, whoever holds it (until then the member processes whatever
        the group assigns it). Raises a ``KasperError`` subclass when a turn fails;
        nothing of that batch is committed and the processor is closed."""
        if self._life.shut:
            raise KasperError(f"processor {self.config.name!r} is closed")
        with self._life.running():
            try:
                self._start()
                with paced_for(self.config.largest_batch):
                    self._loop(until_caught_up)
                if self._life.closing.is_set():
                    self._shutdown()  # while running: close() waits for the clients
            except SimulatedCrash:
                self._life.shut = True  # a killed process cleans nothing up
                raise
            except BaseException as exc:
                self._fail(exc)
                raise

    def run_until_stopped(self, until_caught_up: bool = False) -> str | None:
        """``run_loop()`` with SIGTERM and SIGINT closing the processor gracefully (the
        batch in hand is committed, then the clients close; a second signal stops at once,
        uncommitted: ``KeyboardInterrupt``). Returns the signal's name, or ``None`` when
        the loop ended on its own (``until_caught_up``; clients and stores stay open).
        A signal ``kasper run`` held since its process started closes the processor
        before the loop runs. Call it from the main thread, where Python runs signal
        handlers."""
        with closing_on_signals(self.close, self.config.name) as caught:
            if not caught:
                self.run_loop(until_caught_up=until_caught_up)
        return caught[0] if caught else None

    def close(self, timeout: float | None = None) -> None:
        """Stop after the batch in hand is committed, then close the clients. Safe from
        another thread (waits up to ``timeout`` for the loop to stop) and from a signal
        handler (returns at once; the loop closes when the turn ends)."""
        self._life.close(self._shutdown, timeout)

    def __enter__(self) -> TopicProcessor:
        return self

    def __exit__(self, *_exc: object) -> None:  # leaving a ``with`` block closes it
        self.close()

    def has_consumed_all(self) -> bool:
        """True when every assigned partition's next offset reached its high watermark
        and no batch read ahead waits. The high watermarks are the consumer's cached ones,
        renewed by every fetch response: free to check after every batch not full."""
        return (self._assignment.ensure_assigned() and not self._prefetcher.holding()
                and consumed_all(self._consumer, self.config.auto_offset_reset))

    def committed_offsets(self) -> dict[TopicPartitionKey, int | None]:
        """The group's committed next offset per assigned partition, read from the broker."""
        return self._consumer.committed()

    @property
    def assigned(self) -> list[TopicPartitionKey]:
        """(topic, partition) pairs this process consumes."""
        return list(self._consumer.assigned)

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
        return self._servers.endpoint

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of the loop's metrics server, if any (the stack's discovery)."""
        return self._servers.metrics_address

    @property
    def admin_address(self) -> tuple[str, int] | None:
        """(host, port) of the loop's admin endpoint (``Config.admin_port``), if any."""
        return self._servers.admin_address

    # -- the loop -------------------------------------------------------------

    def _start(self) -> None:
        if not self._life.started:
            if self._plan.internal:  # an app's repartition topics
                self._ensure_topics(self.config, self._plan.sources, self._plan.internal)
            self._election.start()
            count = self._consumer.partition_count()
            if self._plan.routes is not None:  # where the DSL's packed records go
                self._plan.routes.know_counts(Counter(
                    topic for topic, _ in self._consumer.keys(range(count))))
            self._assignment.start(count)
            self._standbys.start()  # a thread of its own: turns never wait for it
            self._life.started = True

    def _loop(self, until_caught_up: bool) -> None:
        schedule = self._engine.time
        waking = self._promotions.waking(schedule)  # a promotion/release ends the wait
        while not self._life.closing.is_set():
            size = self._prefetcher.size
            batch = self._prefetcher.next_batch(waking)
            batch = self._assignment.after_consume(batch)
            if batch.ranges or schedule.due():
                self._turn(batch)  # with no input: for the timers and tasks due
            if not batch.ranges:
                self._observer.on_idle()
                self._committer.heartbeat()
            if (until_caught_up and len(batch) < size
                    and self._assignment.caught_up(self.has_consumed_all)):
                return

    def _turn(self, batch: Batch) -> None:
        """Run ``batch``'s turn (``loop/turns.py``), then report it (step 6)."""
        result = self._turns.run(batch)
        self._assignment.after_turn(result.durations)
        stats = turn_stats(batch, result, self._consumer, self._committer.offsets,
                           self.config.auto_offset_reset)
        self._prefetcher.observe(stats)
        report(self._observer, stats, self.config.name)

    def _fail(self, exc: BaseException) -> None:
        self._observer.on_error(exc)
        if isinstance(exc, KasperError):
            _log.error("kasper.stopped", processor=self.config.name, error=str(exc),
                       error_type=type(exc).__name__)
        self._shutdown(kafka_ok=kafka_usable_after(exc))

    def _shutdown(self, kafka_ok: bool = True) -> None:
        if not self._life.shut_once():
            return
        if kafka_ok and self._life.started:
            self._committer.note_stopped()
        close_all([self._election.close,  # first: the lead moves on at once
                   self._promotions.close,  # no promotion waits for a loop that stopped
                   *self._servers.closing_queries(),  # before the stores close
                   self._standbys.close,
                   *self._engine.close_steps(), *[spec.close for spec in self._store_specs],
                   lambda: self._producer.close(discard=not kafka_ok), self._consumer.close,
                   self._observer.on_stop, *self._servers.closing_metrics(),
                   self._tracing.close],  # a tracer provider built from Config.tracing
                  self.config.name)
        _log.info("kasper.closed", processor=self.config.name)


def _watch(observer: LoopObserver, plan: Plan, prefetcher: Prefetcher) -> None:
    """Hand ``observer`` what it reads at scrape time: the app's processor stats, and
    alignment's waits when the loop aligns its inputs."""
    if plan.stats is not None:
        observer.watch_processors(plan.stats.snapshot)
    if prefetcher.alignment is not None:
        observer.watch_alignment(prefetcher.alignment.report)
