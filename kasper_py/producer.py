"""``OutputProducer`` wraps confluent_kafka.Producer: produces a turn's buffered
messages (``produce_batch`` per run of one topic and partition), keeps the first delivery
error, and raises it when the turn waits for its acks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kasper_py._client_log import with_client_log
from kasper_py.config import Config
from kasper_py.exceptions import ProduceError
from kasper_py.message import OutgoingMessage

__all__ = ["OutputProducer"]

_QUEUE_FULL_PAUSE = 0.05
_WAIT_SLICE = 1.0


class OutputProducer:
    """Idempotent, acks=all producer; a failed delivery fails the turn that sent it."""

    def __init__(self, config: Config) -> None:
        self._delivery_timeout = config.delivery_timeout
        self._producer = Producer(with_client_log(config.to_producer_conf(), config.name,
                                                  "producer"))
        self._error: ProduceError | None = None
        self.produced = 0

    def produce(self, messages: Iterable[OutgoingMessage]) -> None:
        """Enqueue ``messages`` keeping each topic's send order; acks arrive later, see
        ``wait_for_acks``.

        ``produce_batch`` takes one partition (-1: the partitioner runs on each key) and
        no headers per call, so each topic's messages go out as consecutive runs with
        the same partition and no headers; a message with headers goes alone, after the
        run before it. Kafka orders nothing across topics, so topics may interleave.
        """
        runs: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # topic -> its open run
        for topic, value, key, partition, headers in messages:
            target = -1 if partition is None else partition
            run = runs.get(topic)
            if headers:
                if run is not None:
                    del runs[topic]
                    self._produce_batch(topic, *run)
                self._produce_one(OutgoingMessage(topic, value, key, partition, headers))
                continue
            if run is None or run[0] != target:
                if run is not None:
                    self._produce_batch(topic, *run)
                run = runs[topic] = (target, [])
            run[1].append({"value": value, "key": key})
        for topic, (target, entries) in runs.items():
            self._produce_batch(topic, target, entries)

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        """Block until every enqueued message is acknowledged; raise the first failure.
        ``waiting`` is called about once a second while acks are outstanding (the loop
        stays live during a long wait, which ends by ``delivery_timeout`` at the latest)."""
        deadline = time.monotonic() + self._delivery_timeout
        remaining = self._producer.flush(min(_WAIT_SLICE, self._delivery_timeout))
        while remaining and time.monotonic() < deadline:
            if waiting is not None:
                waiting()
            remaining = self._producer.flush(min(_WAIT_SLICE, deadline - time.monotonic()))
        self._raise_for_error()
        if remaining:
            raise ProduceError(
                f"{remaining} messages were not acknowledged within {self._delivery_timeout}s",
                code=KafkaError._MSG_TIMED_OUT,
            )

    def close(self, discard: bool = False) -> None:
        """Deliver what is still queued (bounded by the delivery timeout); with
        ``discard``, drop it instead (a failed turn's output, replayed on restart)."""
        if discard:
            self._producer.purge()
        self._producer.flush(0 if discard else self._delivery_timeout)

    def _on_delivery(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            return
        if self._error is None:
            self._error = ProduceError(
                f"delivery to {message.topic()}[{message.partition()}] failed: {error.str()}",
                code=error.code(),
            )

    def _raise_for_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _produce_batch(self, topic: str, partition: int, entries: list[dict[str, Any]]) -> None:
        pending = entries
        deadline = time.monotonic() + self._delivery_timeout
        while pending:
            try:
                queued = self._producer.produce_batch(
                    topic, pending, partition=partition, on_delivery=self._on_delivery)
            except BufferError:
                queued = 0
                for entry in pending:
                    entry["_error"] = KafkaError(KafkaError._QUEUE_FULL)
            except KafkaException as exc:
                raise _enqueue_error(topic, exc.args[0]) from exc
            self.produced += queued
            if queued == len(pending):
                return
            if time.monotonic() > deadline:
                raise ProduceError(f"producer queue stayed full for {topic!r}",
                                   code=KafkaError._QUEUE_FULL)
            pending = self._failed_to_enqueue(topic, pending)

    def _failed_to_enqueue(
        self, topic: str, entries: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Entries that failed only because the queue was full, to try again after a poll."""
        retry = []
        for entry in entries:
            error = entry.pop("_error", None)
            if error is None:
                continue
            if error.code() != KafkaError._QUEUE_FULL:
                raise _enqueue_error(topic, error)
            retry.append(entry)
        self._producer.poll(_QUEUE_FULL_PAUSE)
        return retry

    def _produce_one(self, message: OutgoingMessage) -> None:
        kwargs: dict[str, Any] = {"value": message.value, "key": message.key,
                                  "headers": list(message.headers or ()),
                                  "on_delivery": self._on_delivery}
        if message.partition is not None:
            kwargs["partition"] = message.partition
        deadline = time.monotonic() + self._delivery_timeout
        while True:
            try:
                self._producer.produce(message.topic, **kwargs)
                self.produced += 1
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise ProduceError(f"producer queue stayed full for {message.topic!r}",
                                       code=KafkaError._QUEUE_FULL) from None
                self._producer.poll(_QUEUE_FULL_PAUSE)
            except KafkaException as exc:
                raise _enqueue_error(message.topic, exc.args[0]) from exc


def _enqueue_error(topic: str, error: Any) -> ProduceError:
    text = error.str() if isinstance(error, KafkaError) else str(error)
    code = error.code() if isinstance(error, KafkaError) else None
    return ProduceError(f"cannot produce to {topic!r}: {text}", code=code)
