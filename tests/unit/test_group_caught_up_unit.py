"""``run_loop(until_caught_up=True)`` in group mode returns only when the group holds no
lag on any input partition, not when this member's own partitions are done. The real
``TopicProcessor`` on ``InMemoryBroker``, behind a consumer that plays the group
coordinator for one member. No server, no sleeping."""

from __future__ import annotations

from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.kafka.ports import Rebalance
from kasper_py.testing import InMemoryBroker

RECORDS = 10  # per partition


class Upper(MessageProcessor):
    """Sends each value upper-cased to "out"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send("out", m.value.upper(), key=m.key)


class LateAssignments:
    """The member's consumer on the broker, joined to a group whose coordinator hands it
    ``waves`` of partitions: the first at once, each next one after ``idle`` consumes
    in a row found nothing (the session of the member that held them expired)."""

    def __init__(self, consumer: Any, waves: list[list[int]], idle: int) -> None:
        self._consumer, self._waves, self._idle = consumer, waves, idle
        self._found_nothing = 0
        self._on_assign: Rebalance | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return list(self._consumer.assigned)

    def subscribe(self, on_assign: Rebalance, _on_revoke: Rebalance) -> None:
        self._on_assign = on_assign

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        assert self._on_assign is not None, "consume before subscribe"
        if self._waves and (not self.assigned or self._found_nothing >= self._idle):
            added = [("in", p) for p in self._waves.pop(0)]
            held = sorted({*self.assigned, *added})
            self._consumer.assigned = held  # as the client says before the callback
            starts = self._on_assign(added) or {}
            self._consumer.assign(sorted({p for _, p in held}), starts)
            self._found_nothing = 0
        records = self._consumer.consume(max_count, timeout)
        self._found_nothing = 0 if records else self._found_nothing + 1
        return records


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_member_runs_until_the_group_holds_no_lag(guarantee: str) -> None:
    """The member gets partition 0 first; partition 1, with nothing committed, comes to
    it only after it found nothing new for a while. It returns once both are processed
    and committed to their ends, every input sent once, not when partition 0 is done."""
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    broker.create_topic("out", partitions=2)
    for p in range(2):
        for i in range(RECORDS):
            broker.produce("in", f"v{p}-{i}", partition=p)
    config = Config(name="members", bootstrap_servers="in-memory", input_topics=["in"],
                    assignment="group", value_serde="str", batch_size=4,
                    processing_guarantee=guarantee)
    clients = broker.clients(config)
    clients.consumer = LateAssignments(clients.consumer, [[0], [1]], idle=5)
    TopicProcessor(config, Upper, clients=clients).run_loop(until_caught_up=True)
    assert broker.committed("members") == {("in", 0): RECORDS, ("in", 1): RECORDS}
    assert sorted(m.value for m in broker.read("out")) == sorted(
        f"V{p}-{i}".encode() for p in range(2) for i in range(RECORDS))
