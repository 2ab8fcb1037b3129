"""``OutputProducer`` wraps confluent_kafka.Producer: produces a turn's buffered
messages in order, keeps the first delivery error, and raises it when the turn waits
for its acks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kasper_py._client_log import with_client_log
from kasper_py.config import Config
from kasper_py.exceptions import ProduceError
from kasper_py.message import OutgoingRecord

__all__ = ["OutputProducer"]

_QUEUE_FULL_PAUSE = 0.05
_WAIT_SLICE = 1.0


class OutputProducer:
    """Idempotent, acks=all producer; a failed delivery fails the turn that sent it."""

    def __init__(self, config: Config) -> None:
        self._delivery_timeout = config.delivery_timeout
        conf = with_client_log(config.to_producer_conf(), config.name, "producer")
        self._producer = Producer({**conf, "on_delivery": self._on_delivery})
        self._error: ProduceError | None = None

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        """Enqueue ``messages`` in the order given, so in send order per output partition;
        acks arrive later, see ``wait_for_acks``.

        One ``produce()`` per message and no callback per message: librdkafka reports
        only failed deliveries (``delivery.report.only.error``), to the one callback the
        client was built with. That costs less per message than ``produce_batch``, whose
        entries must each be a dict and which takes no headers.
        """
        produce = self._producer.produce
        start, count = 0, len(messages)
        deadline = time.monotonic() + self._delivery_timeout
        while start < count:
            index, topic = start, messages[start][0]
            try:
                for index in range(start, count):
                    topic, value, key, partition, headers = messages[index]
                    if headers:
                        produce(topic, value, key, -1 if partition is None else partition,
                                headers=list(headers))
                    else:
                        produce(topic, value, key, -1 if partition is None else partition)
                return
            except BufferError:
                # the local queue is full: serve acks for a moment, then go on from here
                if time.monotonic() > deadline:
                    raise ProduceError(f"producer queue stayed full for {topic!r}",
                                       code=KafkaError._QUEUE_FULL) from None
                self._producer.poll(_QUEUE_FULL_PAUSE)
                start = index
            except KafkaException as exc:
                raise _enqueue_error(topic, exc.args[0]) from exc

    def outstanding(self) -> int:
        """Messages handed over and not yet acknowledged (or failed); never blocks."""
        return len(self._producer)

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


def _enqueue_error(topic: str, error: Any) -> ProduceError:
    text = error.str() if isinstance(error, KafkaError) else str(error)
    code = error.code() if isinstance(error, KafkaError) else None
    return ProduceError(f"cannot produce to {topic!r}: {text}", code=code)
