"""Poison-message bisection (``kasper_py.turn.poison``), alone and inside the turn: a
batch with one message ``process()`` always fails on, wherever it sits, has every other
message's output and store writes take effect once and that message dead-lettered with
its original bytes; with ``on_process_error="fail"`` the turn fails and sends nothing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessingError, ProcessorContext, Sender
from kasper_py.dead_letters import DeadLetterLimits
from kasper_py.kafka.batching import Batch, decode_batch
from kasper_py.message import OutgoingMessage
from kasper_py.serdes import serde_for
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.memory import MemoryStore, MemoryTable
from kasper_py.time.keeper import TimeKeeper
from kasper_py.turn import PartitionState, TurnEngine
from kasper_py.turn.poison import Bisection, ProcessRaisedError
from tests.turn_ports import ListPort

CONFIG = Config(name="poison", bootstrap_servers="in-memory", input_topics=["in"],
                value_serde="str", on_process_error="dead_letter", dead_letter_topic="dlq")
VALUES = [f"v{n}" for n in range(8)]
POSITIONS = [0, 3, 4, 7]


def batch_of(values: Sequence[str]) -> Batch:
    read = [Message("in", 0, offset, None, value.encode(), 1_000 + offset)
            for offset, value in enumerate(values)]
    return decode_batch(read, serde_for("bytes"), serde_for("str"), keep_read=True)


def sender_for(config: Config) -> Sender:
    return Sender(config.key_decoder, config.value_decoder)


def with_poison(position: int) -> list[str]:
    return [*VALUES[:position], "poison", *VALUES[position:]]


# -- the part alone -----------------------------------------------------------------------


class Counted:
    """Applies messages as ``TurnEngine._apply`` does: each one's value sent to "out" and
    counted in the partition's store, then ``process()`` fails on "poison" (its earlier
    effects made, so an attempt must undo them)."""

    def __init__(self, state: PartitionState) -> None:
        self.state, self.attempts, self.failed, self.rebuilt = state, 0, 0, 0

    def apply(self, partition: int, messages: list[Message], batch: Batch,
              sender: Sender) -> None:
        self.attempts += 1
        store = self.state.stores["counts"]
        for message in messages:
            sender.send("out", message.value)
            store.put(message.value, (store.get(message.value) or 0) + 1)
            if message.value == "poison":
                self.failed += 1
                raise ProcessRaisedError(ValueError("cannot digest poison"))

    def rebuild(self, state: PartitionState) -> None:
        self.rebuilt += 1


@pytest.mark.parametrize("position", POSITIONS)
def test_bisection_sets_the_poison_message_aside_and_keeps_the_others(position: int
                                                                       ) -> None:
    state = PartitionState(0, stores={"counts": MemoryStore()})
    counted = Counted(state)
    bisection = Bisection("poison", TimeKeeper(CONFIG, None), DeadLetterLimits(CONFIG),
                          apply=counted.apply, rebuild=counted.rebuild)
    batch, sender = batch_of(with_poison(position)), sender_for(CONFIG)

    letters = bisection.settle(state, batch.by_partition[0], batch, sender, failed=0)

    assert [(letter.record.offset, letter.record.value, letter.reason, letter.error,
             letter.error_type) for letter in letters] == [
        (position, b"poison", "process", "cannot digest poison", "ValueError")]
    assert [OutgoingMessage.of(r).value for r in sender.drain()] == [
        value.encode() for value in VALUES]
    state.stores["counts"].flush({})
    assert state.stores["counts"].data == dict.fromkeys(VALUES, 1)
    # every failed attempt was undone and its processor rebuilt: the whole batch, down
    # to the poison message alone
    assert counted.rebuilt == counted.failed >= 2


def test_bisection_of_a_batch_that_succeeds_attempts_once_and_finds_nothing() -> None:
    state = PartitionState(0, stores={"counts": MemoryStore()})
    counted = Counted(state)
    bisection = Bisection("poison", TimeKeeper(CONFIG, None), DeadLetterLimits(CONFIG),
                          apply=counted.apply, rebuild=counted.rebuild)
    batch, sender = batch_of(VALUES), sender_for(CONFIG)

    assert bisection.settle(state, batch.by_partition[0], batch, sender, failed=0) == []
    assert (counted.attempts, counted.rebuilt, len(sender)) == (1, 0, len(VALUES))


# -- inside the turn ----------------------------------------------------------------------


class Forward(MessageProcessor):
    """Forwards each value to "out" and counts it; raises on "poison"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send("out", message.value)
            self.counts.put(message.value, (self.counts.get(message.value) or 0) + 1)
            if message.value == "poison":
                raise ValueError("cannot digest poison")


def engine_for(config: Config) -> tuple[TurnEngine, ListPort, MemoryTable]:
    port, table = ListPort(), MemoryTable("counts")
    engine = TurnEngine(config, port, wall_clock=None)
    engine.open_partition(0, Forward, [table], StoreRuntime(config, 0, None))  # type: ignore[arg-type]
    return engine, port, table


@pytest.mark.parametrize("position", POSITIONS)
def test_a_turn_sends_the_good_messages_and_dead_letters_the_poison(position: int) -> None:
    engine, port, table = engine_for(CONFIG)

    result = engine.run(batch_of(with_poison(position)))

    assert [(m.topic, m.value) for m in port.acked if m.topic == "out"] == [
        ("out", value.encode()) for value in VALUES]
    (letter,) = [m for m in port.acked if m.topic == "dlq"]
    assert letter.value == b"poison"
    headers = dict(letter.headers)
    assert (headers["kasper.error"], headers["kasper.error.type"]) == (
        b"cannot digest poison", b"ValueError")
    assert result.next_offsets == {("in", 0): len(VALUES) + 1}
    assert [d.record.offset for d in result.dead_letters] == [position]
    assert table.partitions[0].data == dict.fromkeys(VALUES, 1)


def test_with_fail_the_poison_fails_the_turn_and_nothing_is_sent() -> None:
    engine, port, table = engine_for(Config(name="poison", bootstrap_servers="in-memory",
                                            input_topics=["in"], value_serde="str"))
    with pytest.raises(ProcessingError, match="cannot digest poison") as info:
        engine.run(batch_of(with_poison(3)))
    assert info.value.uncommitted is not None
    assert port.acked == []
    assert table.partitions[0].data == {}
