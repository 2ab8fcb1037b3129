"""The collector's pace while a loop runs: the youngest generation's threshold is raised
for the batch size and put back afterwards, and never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import ClassVar

import pytest

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py._support.gc import paced_for
from kasper_py.testing import InMemoryBroker


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[tuple[int, int, int]]:
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield found
    gc.set_threshold(*found)


class Watch(MessageProcessor):
    seen: ClassVar[list[tuple[int, int, int]]] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        Watch.seen.append(gc.get_threshold())


def test_a_running_loop_collects_less_often_and_puts_the_thresholds_back() -> None:
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.produce("in", b"v")
    config = Config(name="gc", bootstrap_servers="in-memory", input_topics=["in"],
                    batch_size=10_000)
    with TopicProcessor(config, lambda _c: Watch(), clients=broker.clients(config)) as loop:
        loop.run_loop(until_caught_up=True)
    assert Watch.seen == [(50_000, 10, 10)]
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_set_by_the_user_is_kept() -> None:
    gc.set_threshold(1_000_000, 10, 10)
    with paced_for(1000):
        assert gc.get_threshold() == (1_000_000, 10, 10)
    assert gc.get_threshold() == (1_000_000, 10, 10)


def test_the_thresholds_come_back_when_the_loop_fails() -> None:
    with pytest.raises(RuntimeError), paced_for(1000):
        assert gc.get_threshold() == (5000, 10, 10)
        raise RuntimeError("turn failed")
    assert gc.get_threshold() == (700, 10, 10)
