"""InputConsumer without a broker: reading committed offsets must never take an error
for "nothing committed", which would start that partition at auto_offset_reset; an
input topic just created is looked for again before it is called missing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

import kasper_py.kafka.admin as admin_module
from kasper_py import Config, ConsumeError, TopicError
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


class MetadataAnswers:
    """Stands in for confluent_kafka.Consumer.list_topics: the topics of each answer
    (name -> partition count), the last answer again once the others are used."""

    def __init__(self, *answers: dict[str, int]) -> None:
        self.answers, self.calls = list(answers), 0

    def list_topics(self, timeout: float) -> Any:
        self.calls += 1
        topics = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return SimpleNamespace(topics={
            name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
            for name, count in topics.items()})

    def close(self) -> None:
        pass


def consumer_listing(monkeypatch: pytest.MonkeyPatch, *answers: dict[str, int]
                     ) -> tuple[InputConsumer, MetadataAnswers]:
    monkeypatch.setattr(admin_module, "INPUT_STEP", 0.001)
    consumer = InputConsumer(Config(name="c", bootstrap_servers="127.0.0.1:1",
                                    input_topics=["t"]))
    consumer._consumer.close()
    consumer._consumer = listing = MetadataAnswers(*answers)  # type: ignore[assignment]
    return consumer, listing


def test_a_topic_not_yet_in_the_metadata_is_looked_for_again(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A topic created just before the loop starts, missing from the first answers
    (a broker's metadata lags the controller's), is found: its count is returned."""
    consumer, listing = consumer_listing(monkeypatch, {}, {"other": 1}, {"t": 3})
    assert consumer.partition_count() == 3
    assert listing.calls == 3


def test_a_topic_still_missing_after_the_grace_is_named(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A topic absent for the whole grace is a TopicError naming it."""
    monkeypatch.setattr(admin_module, "INPUT_GRACE", 0.05)
    consumer, listing = consumer_listing(monkeypatch, {"other": 1})
    with pytest.raises(TopicError, match=r"input topic 't': does not exist on 127\.0\.0\.1:1"):
        consumer.partition_count()
    assert listing.calls > 1
