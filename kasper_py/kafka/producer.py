"""``OutputProducer`` wraps confluent_kafka.Producer: produces a turn's buffered
messages in order, keeps the first delivery error, and raises it when the turn waits
for its acks. With ``exactly_once`` it also runs the turn's transaction (``Transactions``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from itertools import starmap
from operator import length_hint
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kasper_py.config import Config
from kasper_py.exceptions import CommitError, FencedError, KasperError, ProduceError
from kasper_py.kafka.client_log import with_client_log
from kasper_py.kafka.topics import topic_problem
from kasper_py.message import OutgoingRecord, TopicPartitionKey

__all__ = ["OutputProducer"]

_QUEUE_FULL_PAUSE = 0.05
_WAIT_SLICE = 1.0
# What a broker answers a producer whose transactional id a newer one took over.
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                     KafkaError.INVALID_PRODUCER_EPOCH})
_log = structlog.get_logger("kasper_py")


class OutputProducer:
    """Idempotent, acks=all producer; a failed delivery fails the turn that sent it."""

    def __init__(self, config: Config) -> None:
        self._delivery_timeout = config.delivery_timeout
        self._servers = config.bootstrap_servers
        self._transactional_id = config.transactional_id if config.exactly_once else None
        conf = with_client_log(config.to_producer_conf(), config.name, "producer")
        self._conf = conf
        self._producer = Producer({**conf, "on_delivery": self._on_delivery})
        self._error: KasperError | None = None
        self._in_transaction = False
        self._adding: Future[None] | None = None
        """The open transaction's offsets being added (``add_offsets``), until settled."""
        self._worker = (ThreadPoolExecutor(1, thread_name_prefix="kasper-transaction")
                        if self._transactional_id else None)
        """Exactly-once: the thread that adds a turn's offsets while the loop goes on."""
        self._probe_topic = config.input_topics[0]
        """A topic whose metadata is asked for before a transactional id is taken."""

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        """Enqueue ``messages`` in the order given, so in send order per output partition;
        acks arrive later, see ``wait_for_acks``.

        One ``produce()`` per message and no callback per message: librdkafka reports
        only failed deliveries (``delivery.report.only.error``), to the one callback the
        client was built with. That costs less per message than ``produce_batch``, whose
        entries must each be a dict and which takes no headers. A record is the call's
        arguments by position (see ``OutgoingRecord``): keywords cost half as much again
        per call, and unpacking fields into it a fifth. The calls are made by
        ``starmap`` in C, with no Python bytecode run between two of them.
        """
        deadline = time.monotonic() + self._delivery_timeout
        rest = list(messages)
        while rest:
            queued = iter(rest)
            try:
                deque(starmap(self._producer.produce, queued), maxlen=0)
                return
            except BufferError:
                # the local queue is full: serve acks for a moment, then go on from the
                # record it refused (the one starmap took last)
                rest = rest[len(rest) - length_hint(queued) - 1:]
                if time.monotonic() > deadline:
                    raise ProduceError(f"producer queue stayed full for {rest[0][0]!r}",
                                       code=KafkaError._QUEUE_FULL) from None
                self._producer.poll(_QUEUE_FULL_PAUSE)
            except KafkaException as exc:
                topic = rest[len(rest) - length_hint(queued) - 1][0]
                raise (self._fenced(exc.args[0])
                       or _produce_error(f"cannot produce to {topic!r}", exc.args[0])) from exc

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        """Those of ``topics`` the cluster's metadata says cannot be produced to (absent,
        or refused), with why: one metadata request per topic, which never creates it
        (the producer runs with ``allow.auto.create.topics=false``; see
        ``Config.to_producer_conf``). ``ProduceError`` when the cluster does not answer
        within ``delivery_timeout``."""
        missing: dict[str, str] = {}
        for topic in sorted(topics):
            try:
                metadata = self._producer.list_topics(topic, timeout=self._delivery_timeout)
            except KafkaException as exc:
                raise _produce_error(f"cannot read the metadata of topic {topic!r} from "
                                     f"{self._servers} within {self._delivery_timeout:g}s",
                                     exc.args[0]) from exc
            problem = topic_problem(metadata.topics.get(topic))
            if problem is not None:
                missing[topic] = problem
        return missing

    def outstanding(self) -> int:
        """Messages handed over and not yet acknowledged (or failed); never blocks.

        Serves the client's queue first: librdkafka counts an acked message as
        outstanding until its (error-only, so silent) delivery report is served, and
        without this the count never fell while the loop read ahead (measured: 1,000
        messages "outstanding" for 2 s, 16 ms once served)."""
        self._producer.poll(0)
        return len(self._producer)

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        """Block until every enqueued message is acknowledged; raise the first failure.
        ``waiting`` is called about once a second while acks are outstanding (the loop
        stays live during a long wait, which ends by ``delivery_timeout`` at the latest)."""
        deadline = time.monotonic() + self._delivery_timeout
        remaining = self._flush(min(_WAIT_SLICE, self._delivery_timeout))
        while remaining and time.monotonic() < deadline:
            if waiting is not None:
                waiting()
            remaining = self._flush(min(_WAIT_SLICE, deadline - time.monotonic()))
        self._raise_for_error()
        if remaining:
            raise ProduceError(
                f"{remaining} messages were not acknowledged by {self._servers} within "
                f"{self._delivery_timeout:g}s",
                code=KafkaError._MSG_TIMED_OUT,
            )

    def _flush(self, timeout: float) -> int:
        try:
            return int(self._producer.flush(timeout))
        except SystemError as exc:
            raise self._fatal_error() from exc

    def _fatal_error(self) -> KasperError:
        """confluent-kafka's ``flush()`` raises a bare SystemError once the client hit a
        fatal error (seen when a transactional producer is fenced mid-turn); the
        transaction API still reports the error itself, so ask it."""
        if self._in_transaction:
            self._in_transaction = False
            try:
                self._producer.abort_transaction(_WAIT_SLICE)
            except KafkaException as exc:
                error = exc.args[0]
                return self._fenced(error) or ProduceError(
                    f"the producer failed: {error.str()}", code=error.code())
        return ProduceError("the producer failed with a fatal error (see the client log)")

    # -- transactions (exactly-once) -------------------------------------------------

    def init_transactions(self) -> None:
        """Take over the transactional id: a producer that held it is fenced, and its
        open transaction aborted, before this returns."""
        _await_broker(self._producer, self._probe_topic, self._delivery_timeout)
        self._transaction_call("taking over the transactional id",
                               self._producer.init_transactions, self._delivery_timeout)

    def fence(self, transactional_id: str) -> None:
        """Take ``transactional_id`` (another loop's) over once, with a producer of its
        own: the producer that held it is fenced and its open transaction aborted before
        this returns, so its writes are final (committed or aborted). Never this
        producer's own id: that would fence this loop."""
        if transactional_id == self._transactional_id:
            raise ValueError(f"{transactional_id!r} is this loop's own transactional id")
        conf = {k: v for k, v in self._conf.items() if k != "on_delivery"}
        fencer = Producer({**conf, "transactional.id": transactional_id})
        try:
            _await_broker(fencer, self._probe_topic, self._delivery_timeout)
            fencer.init_transactions(self._delivery_timeout)
        except KafkaException as exc:
            raise CommitError(f"exactly-once: fencing transactional id {transactional_id!r} "
                              f"on {self._servers} failed: {exc.args[0].str()}",
                              code=exc.args[0].code()) from exc
        finally:
            fencer.flush(0)

    def begin(self) -> None:
        """Open the turn's transaction."""
        self._transaction_call("beginning a transaction", self._producer.begin_transaction)
        self._in_transaction = True

    def add_offsets(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
                    group: object) -> None:
        """Start adding the input offsets (``note`` as metadata) to the open transaction
        and return: the two round trips (the transaction coordinator, then the group's;
        1.5-2 ms a turn on one local broker) run on this producer's worker thread while
        the loop reads ahead and the acks arrive. ``commit`` waits for them and raises
        what they raised; ``abort`` waits for them too (librdkafka refuses a second
        transactional call while one is in flight)."""
        offsets = _partitions(next_offsets, note)
        if not offsets:
            return
        self._settle()
        if self._worker is None:
            raise CommitError("exactly-once: no transactional id: the producer was built for "
                              "at-least-once", code=KafkaError._NOT_CONFIGURED)
        self._adding = self._worker.submit(self._send_offsets, offsets, group)

    def _send_offsets(self, offsets: list[TopicPartition], group: object) -> None:
        self._transaction_call("adding the input offsets to the transaction",
                               self._producer.send_offsets_to_transaction, offsets, group,
                               self._delivery_timeout)

    def _settle(self) -> None:
        """Wait for the offsets being added, if any; raise what adding them raised."""
        adding, self._adding = self._adding, None
        if adding is not None:
            adding.result()

    def commit(self, next_offsets: dict[TopicPartitionKey, int], note: str | None,
               group: object) -> None:
        """Add the input offsets (``add_offsets``; none: only those added before) and
        commit: the turn's outputs, changelog records and offsets become visible
        together. The acks were awaited before (``wait_for_acks``), so this costs the
        commit round trips only."""
        self._settle()
        offsets = _partitions(next_offsets, note)
        if offsets:  # on this thread: the commit waits for them anyway
            self._send_offsets(offsets, group)
        self._transaction_call("committing the transaction", self._producer.commit_transaction,
                               self._delivery_timeout)
        self._in_transaction = False

    def abort(self) -> bool:
        """Abort the open transaction (its outputs are never visible to read_committed
        readers); True when one was open. A failure is logged, not raised: the broker
        aborts it anyway, at the transaction timeout or when the id is taken over."""
        with suppress(KasperError):  # the transaction is aborted anyway
            self._settle()
        if not self._in_transaction:
            return False
        self._in_transaction = False
        self._error = None
        try:
            self._producer.abort_transaction(self._delivery_timeout)
        except KafkaException as exc:
            _log.warning("kasper.transaction_abort_failed", transactional_id=self._transactional_id,
                         error=exc.args[0].str())
        return True

    def _transaction_call(self, doing: str, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except KafkaException as exc:
            error = exc.args[0]
            raise self._fenced(error) or CommitError(
                f"exactly-once: {doing} on {self._servers} failed (waited up to "
                f"{self._delivery_timeout:g}s): {error.str()}", code=error.code(),
                retriable=error.retriable() or error.txn_requires_abort()) from exc

    def _fenced(self, error: Any) -> FencedError | None:
        if not isinstance(error, KafkaError) or error.code() not in _FENCED:
            return None
        return FencedError(f"exactly-once: transactional id {self._transactional_id!r} was "
                           f"taken over by a newer process ({error.str()})", code=error.code())

    # -- closing and delivery reports -------------------------------------------------

    def close(self, discard: bool = False) -> None:
        """Deliver what is still queued (bounded by the delivery timeout); with
        ``discard``, drop it instead (a failed turn's output, replayed on restart).
        An open transaction is aborted."""
        if discard:
            self._producer.purge()
        self.abort()
        if self._worker is not None:
            self._worker.shutdown()
        self._producer.flush(0 if discard else self._delivery_timeout)

    def _on_delivery(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            return
        if self._error is None:
            waited = (f" (no ack from {self._servers} within {self._delivery_timeout:g}s, "
                      "delivery_timeout)" if error.code() == KafkaError._MSG_TIMED_OUT else "")
            self._error = self._fenced(error) or ProduceError(
                f"delivery to {message.topic()}[{message.partition()}] failed: {error.str()}"
                f"{waited}", code=error.code(),
                retriable=error.retriable() or error.txn_requires_abort(),
            )

    def _raise_for_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def _partitions(next_offsets: dict[TopicPartitionKey, int],
                note: str | None) -> list[TopicPartition]:
    """``next_offsets`` as the client takes them, each with ``note`` as its metadata."""
    return [TopicPartition(t, p, o, note) for (t, p), o in next_offsets.items()]


def _await_broker(producer: Producer, topic: str, timeout: float) -> None:
    """Return once ``producer`` is connected to a broker it knows by id, so that taking a
    transactional id starts at once. librdkafka's transaction manager looks only for such
    a broker; a new client is still on its bootstrap connection, which the first metadata
    answer replaces by one to the broker it names, and finding none the manager retries
    on its 500 ms coordinator timer (``init_transactions`` took 3-4 ms or 505 ms at random
    on one local broker). The first metadata request learns the brokers; the second is
    answered by one of them, once connected. A failure here is left to the call after."""
    try:
        for _ in range(2):
            producer.list_topics(topic, timeout=timeout)
    except KafkaException:
        return


def _produce_error(doing: str, error: Any) -> ProduceError:
    text = error.str() if isinstance(error, KafkaError) else str(error)
    code = error.code() if isinstance(error, KafkaError) else None
    return ProduceError(f"{doing}: {text}", code=code)
