"""``run_loop(until_caught_up=True)`` in group mode returns only when the group holds no
lag on any input partition, not when this member's own partitions are done; partitions
of one topic assigned a rebalance before their peers of another wait for them. The real
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
    ``waves`` of topic-partitions: the first at once, each next one after ``idle``
    consumes in a row found nothing (the member that held them released them, or its
    session expired)."""

    def __init__(self, consumer: Any, waves: list[list[tuple[str, int]]], idle: int) -> None:
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
            added = self._waves.pop(0)
            held = sorted({*self.assigned, *added})
            self._consumer.assigned = held  # as the client says before the callback
            starts = self._on_assign(added) or {}
            self._consumer.assign(sorted({p for _, p in added}), starts)
            self._consumer.assigned = held  # of some topics only, maybe
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
    clients.consumer = LateAssignments(clients.consumer, [[("in", 0)], [("in", 1)]], idle=5)
    TopicProcessor(config, Upper, clients=clients).run_loop(until_caught_up=True)
    assert broker.committed("members") == {("in", 0): RECORDS, ("in", 1): RECORDS}
    assert sorted(m.value for m in broker.read("out")) == sorted(
        f"V{p}-{i}".encode() for p in range(2) for i in range(RECORDS))


class Pairs(Upper):
    """Notes what the member held when it was built; sends each value upper-cased."""

    def __init__(self, context: ProcessorContext, held: list[tuple[str, int]]) -> None:
        super().__init__(context)
        self.held_when_built = sorted(held)


@pytest.mark.parametrize("first", ["a", "b"])
def test_peers_assigned_a_rebalance_later_are_waited_for(first: str) -> None:
    """The group hands the member partitions 0 and 1 of one topic, then, once it found
    nothing for a while, of the other (either first; a repartition's partitions come
    first when their previous owner releases them first). It waits, reading nothing of
    the first ones, builds each partition's processor only once both topics of it are
    held, then processes every record once and runs until the group is caught up."""
    broker = InMemoryBroker()
    for topic in ("a", "b", "out"):
        broker.create_topic(topic, partitions=2)
    for topic in ("a", "b"):
        for p in range(2):
            for i in range(RECORDS):
                broker.produce(topic, f"{topic}{p}-{i}", partition=p)
    config = Config(name="pairs", bootstrap_servers="in-memory", input_topics=["a", "b"],
                    assignment="group", value_serde="str", batch_size=4)
    second = "b" if first == "a" else "a"
    clients = broker.clients(config)
    member = LateAssignments(clients.consumer, [[(first, 0), (first, 1)],
                                                [(second, 0), (second, 1)]], idle=5)
    clients.consumer = member
    built: list[Pairs] = []

    def factory(context: ProcessorContext) -> Pairs:
        built.append(Pairs(context, member.assigned))
        return built[-1]

    TopicProcessor(config, factory, clients=clients).run_loop(until_caught_up=True)
    everything = sorted((t, p) for p in range(2) for t in ("a", "b"))
    assert [b.held_when_built for b in built] == [everything] * 2
    assert sorted(m.value for m in broker.read("out")) == sorted(
        f"{t.upper()}{p}-{i}".encode() for t, p in everything for i in range(RECORDS))
    assert broker.committed("pairs") == dict.fromkeys(everything, RECORDS)
