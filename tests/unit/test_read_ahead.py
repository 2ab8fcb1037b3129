"""Reading the next batch while a turn's acks are outstanding, on the real
``TopicProcessor`` and ``kasper_py.testing.InMemoryBroker``: a batch read ahead is never
processed or committed before its own turn, and every failure (delivery, decoding,
crash, close) leaves it uncommitted, so a restart processes it."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    ProduceError,
    Sender,
    SerdeError,
    TopicProcessor,
)
from kasper_py.exceptions import SimulatedCrash
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.testing import InMemoryBroker

GROUP = "ahead"
CONFIG = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
                batch_size=4, max_latency=None)  # classic batches: full ones are read ahead


class Seen(MessageProcessor):
    """Sends each value on; notes, at each process() call, the offsets it was given
    and the group's committed offset."""

    def __init__(self, broker: InMemoryBroker, calls: list[dict[str, Any]]) -> None:
        self.broker, self.calls = broker, calls

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.calls.append({
            "offsets": [m.offset for m in messages],
            "committed": self.broker.committed(GROUP).get(("in", 0), 0),
        })
        for m in messages:
            sender.send("out", m.value)


def broker_with(values: list[bytes]) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.create_topic("out")
    for value in values:
        broker.produce("in", value)
    return broker


def start(broker: InMemoryBroker, calls: list[dict[str, Any]], config: Config = CONFIG,
          observer: NoopObserver | None = None, read: list[int] | None = None
          ) -> TopicProcessor:
    """A TopicProcessor on ``broker``; ``read`` collects every offset it consumes."""
    clients = broker.clients(config)
    consume = clients.consumer.consume

    def consuming(max_count: int, timeout: float) -> list[Any]:
        records = consume(max_count, timeout)
        if read is not None:
            read.extend(r.offset() for r in records)
        return records

    clients.consumer.consume = consuming  # type: ignore[method-assign]
    return TopicProcessor(config, lambda _c: Seen(broker, calls),
                               clients=clients, observer=observer)


def outputs(broker: InMemoryBroker) -> collections.Counter[bytes]:
    return collections.Counter(m.value for m in broker.read("out"))


def values(count: int) -> list[bytes]:
    return [b"v%d" % i for i in range(count)]


class Progress(NoopObserver):
    """After each committed turn: the group's committed offset and how far the loop
    has consumed."""

    def __init__(self, broker: InMemoryBroker, read: list[int]) -> None:
        self.broker, self.read, self.turns = broker, read, []

    def on_turn(self, stats: TurnStats) -> None:
        self.turns.append((self.broker.committed(GROUP)[("in", 0)], max(self.read) + 1))


def test_a_batch_read_ahead_is_processed_and_committed_only_in_its_own_turn() -> None:
    """Each turn reads the next batch while its acks are outstanding, so after a turn
    the loop has consumed a batch past what it committed; yet each batch reaches
    process() only after the one before it is committed."""
    broker = broker_with(values(12))
    calls: list[dict[str, Any]] = []
    read: list[int] = []
    progress = Progress(broker, read)
    with start(broker, calls, observer=progress, read=read) as processor:
        processor.run_loop(until_caught_up=True)
    assert [c["offsets"] for c in calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [c["committed"] for c in calls] == [0, 4, 8]
    assert progress.turns == [(4, 8), (8, 12), (12, 12)]  # (committed, consumed to)
    assert read == list(range(12))  # each record consumed once
    assert outputs(broker) == collections.Counter(values(12))


def test_a_failed_delivery_leaves_the_batch_read_ahead_uncommitted() -> None:
    """The second turn's delivery fails after it read the third batch: the loop stops
    with the second batch's error, the committed offset stays at the end of the first,
    and a restart processes the second and third batches."""
    broker = broker_with(values(12))
    broker.faults.fail_delivery(nth=6)  # the second message of the second turn
    calls: list[dict[str, Any]] = []
    read: list[int] = []
    with pytest.raises(ProduceError, match=r"batch not committed: in\[0\] offsets 4\.\.7"):
        start(broker, calls, read=read).run_loop(until_caught_up=True)
    assert max(read) == 11  # the third batch was read ahead
    assert broker.committed(GROUP) == {("in", 0): 4}
    start(broker, calls).run_loop(until_caught_up=True)
    assert broker.committed(GROUP) == {("in", 0): 12}
    sent = outputs(broker)
    assert set(sent) == set(values(12))
    # the failed turn's other messages were delivered, then replayed: duplicates are
    # bounded by that one batch
    assert {v for v, n in sent.items() if n > 1} <= set(values(8)[4:])


def test_an_undecodable_record_read_ahead_fails_its_own_turn_not_the_one_in_hand() -> None:
    """A record that does not decode in the batch read ahead: the turn in hand still
    completes and commits; the next turn fails with the SerdeError naming that record,
    and its batch stays uncommitted."""
    config = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
                    batch_size=4, value_serde="json", max_latency=None)
    broker = broker_with([b'{"n": %d}' % i for i in range(6)] + [b"{oops", b"{}"])
    calls: list[dict[str, Any]] = []
    with pytest.raises(SerdeError, match=r"in\[0\] offset 6"):
        start(broker, calls, config).run_loop(until_caught_up=True)
    assert [c["offsets"] for c in calls] == [[0, 1, 2, 3]]
    assert broker.committed(GROUP) == {("in", 0): 4}
    assert len(broker.read("out")) == 4


def test_a_crash_with_a_batch_read_ahead_replays_both_batches() -> None:
    """The process dies after the second turn's acks, before its commit, with the third
    batch read ahead: the first batch stays committed; a restart processes the second
    (again) and the third, each input reaching the output."""
    broker = broker_with(values(12))
    broker.faults.crash_at("after_produce", turn=2)
    calls: list[dict[str, Any]] = []
    with pytest.raises(SimulatedCrash):
        start(broker, calls).run_loop(until_caught_up=True)
    assert broker.committed(GROUP) == {("in", 0): 4}
    with start(broker, calls) as processor:
        processor.run_loop(until_caught_up=True)
    assert broker.committed(GROUP) == {("in", 0): 12}
    sent = outputs(broker)
    assert set(sent) == set(values(12))
    assert {v for v, n in sent.items() if n > 1} == set(values(8)[4:])


class CloseAfterFirstTurn(NoopObserver):
    def __init__(self) -> None:
        self.processor: TopicProcessor | None = None

    def on_turn(self, stats: TurnStats) -> None:
        assert self.processor is not None
        self.processor.close()


def test_closing_drops_the_batch_read_ahead_and_a_restart_processes_it_once() -> None:
    """close() after the first turn: that turn commits, the batch read ahead is left
    unprocessed and uncommitted, and the next process handles it exactly once."""
    broker = broker_with(values(8))
    calls: list[dict[str, Any]] = []
    closer = CloseAfterFirstTurn()
    processor = start(broker, calls, observer=closer)
    closer.processor = processor
    processor.run_loop()
    assert [c["offsets"] for c in calls] == [[0, 1, 2, 3]]
    assert broker.committed(GROUP) == {("in", 0): 4}
    with start(broker, calls) as again:
        again.run_loop(until_caught_up=True)
    assert outputs(broker) == collections.Counter(values(8))


def test_until_caught_up_asks_the_broker_for_no_watermarks() -> None:
    """The caught-up check after each short batch reads the consumer's cached high
    watermarks: a loop run to the end makes no watermark round trip."""
    broker = broker_with(values(10))
    clients = broker.clients(CONFIG)
    asked: list[bool] = []
    watermarks = clients.consumer.watermarks

    def counting(key: tuple[str, int], cached: bool = False) -> tuple[int, int]:
        asked.append(cached)
        return watermarks(key, cached)

    clients.consumer.watermarks = counting  # type: ignore[method-assign]
    processor = TopicProcessor(CONFIG, lambda _c: Seen(broker, []),
                               clients=clients)
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert asked and all(asked)
    assert broker.committed(GROUP) == {("in", 0): 10}
