"""Group mode over stages with their own partition count (a 2-partition source, a
6-partition repartition): partitions open with the topics read together, and a member
run until caught up waits for every partition of every input topic, internal ones
included, and for any transaction open on them."""

from __future__ import annotations

import dataclasses

from structlog.testing import capture_logs

from kasper_py.testing import InMemoryBroker

from test_loop_assignment import GROUPED, member, read  # isort: skip

FANNED = dataclasses.replace(GROUPED, input_topics=["a", "r"], input_groups=[["a"], ["r"]])


def test_a_partition_runs_with_the_topics_read_together_and_reopens_for_more() -> None:
    """Topics in different groups (a stage reading a 2-partition source, another a
    6-partition repartition) need no peers of each other: a[1] alone opens partition 1
    at once. r[1] arriving reopens it (its stores restored for the new topic); r[1]
    taken away leaves it running on a[1], untouched: not closed, paused or re-read."""
    broker = InMemoryBroker()
    broker.create_topic("a", 2)
    broker.create_topic("r", 6)
    for topic in ("a", "r"):
        for n in range(3):
            broker.produce(topic, f"{topic}1-{n}", partition=1)
    joined, coordinator = member(broker, FANNED)
    joined.clients.consumer.partition_count()

    coordinator.grant([("a", 1)])
    assert [p for p, _ in joined.built.built] == [1] and coordinator.paused == set()
    assert read(coordinator) == ["a1-0", "a1-1", "a1-2"]
    broker.clients(FANNED).consumer.commit({("a", 1): 2})  # a turn's

    coordinator.grant([("r", 1)])
    assert [p for p, _ in joined.built.built] == [1, 1] and joined.built.closed == [1]
    # the stand-in assigns the partition number anew: a[1] from its committed offset
    assert read(coordinator) == ["a1-2", "r1-0", "r1-1", "r1-2"]

    coordinator.take([("r", 1)])
    assert [p for p, _ in joined.built.built] == [1, 1] and joined.built.closed == [1]
    assert coordinator.paused == set() and list(joined.engine.partitions) == [1]
    broker.produce("a", "a1-3", partition=1)
    assert read(coordinator) == ["a1-3"]  # a[1] read on from where it was


def test_a_member_waits_for_every_partition_of_a_larger_stage_and_open_transactions(
        ) -> None:
    """A 2-partition source and a 6-partition repartition: r[5], beyond the source's
    count, behind its end keeps a member waiting; every partition committed at its end
    but a transaction still open on r[5] (a member's turn in flight, or a killed one's
    until the broker aborts it: its records hidden, the visible end below them) keeps it
    waiting too; once none is open it is caught up."""
    broker = InMemoryBroker()
    broker.create_topic("a", 2)
    broker.create_topic("r", 6)
    for topic, count in (("a", 2), ("r", 6)):
        for p in range(count):
            broker.produce(topic, f"{topic}{p}", partition=p)
    joined, coordinator = member(broker, FANNED, count=6)
    joined.clients.consumer.partition_count()
    coordinator.grant([("a", 0)])
    everything = {(t, p): 1 for t, count in (("a", 2), ("r", 6)) for p in range(count)}
    broker.clients(FANNED).consumer.commit({**everything, ("r", 5): 0})
    with capture_logs() as logs:
        assert not joined.assignment.caught_up(lambda: True)
    [waiting] = [e for e in logs if e["event"] == "kasper.waiting_for_group"]
    assert waiting["partitions"] == ["r[5]"] and waiting["lag"] == 1

    broker.clients(FANNED).consumer.commit(everything)
    consumer = joined.clients.consumer
    open_ones = [("r", 5)]
    consumer.open_transactions = lambda keys: [tp for tp in keys if tp in open_ones]
    coordinator.consume(100, 1.0)  # the next look at the group, a second later
    with capture_logs() as logs:
        assert not joined.assignment.caught_up(lambda: True)
    assert logs == []  # still r[5], named once
    open_ones.clear()
    coordinator.consume(100, 1.0)
    assert joined.assignment.caught_up(lambda: True)
