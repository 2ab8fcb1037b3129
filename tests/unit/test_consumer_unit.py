"""InputConsumer without a broker: reading committed offsets must never take an error
for "nothing committed", which would start that partition at auto_offset_reset."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kasper_py import Config, ConsumeError
from kasper_py.kafka.consumer import InputConsumer


class CommittedAnswers:
    """Stands in for confluent_kafka.Consumer.committed: one answer per call."""

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)

    def committed(self, tps: list[Any], timeout: float) -> list[Any]:
        return self.answers.pop(0)

    def close(self) -> None:
        pass


def partition(offset: int, code: int | None = None) -> Any:
    error = None if code is None else KafkaError(code)
    return SimpleNamespace(topic="t", partition=1, offset=offset, error=error,
                           metadata=None)


def consumer_answering(*answers: list[Any]) -> InputConsumer:
    consumer = InputConsumer(Config(name="c", bootstrap_servers="127.0.0.1:1",
                                    input_topics=["t"]))
    consumer._consumer.close()
    consumer._consumer = CommittedAnswers(*answers)
    return consumer


def test_a_partition_error_is_raised_naming_the_partition() -> None:
    """An authorisation error for one partition is a ConsumeError naming it and keeping
    Kafka's code, not a missing offset."""
    consumer = consumer_answering([partition(-1001, KafkaError.GROUP_AUTHORIZATION_FAILED)])
    with pytest.raises(ConsumeError, match=r"group 'c' for t\[1\] failed") as info:
        consumer.committed([("t", 1)])
    assert info.value.code == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_a_busy_coordinator_is_retried_then_the_offset_is_read() -> None:
    """A coordinator still loading answers per partition; the read is tried again."""
    consumer = consumer_answering([partition(-1001, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)],
                                  [partition(42)])
    assert consumer.committed([("t", 1)]) == {("t", 1): 42}


def test_nothing_committed_is_none() -> None:
    """A partition without a commit and without an error reads as None."""
    assert consumer_answering([partition(-1001)]).committed([("t", 1)]) == {("t", 1): None}
