"""The effectively-once bookkeeping of the turn (``kasper_py.turn.effectively_once``):
input an effectively-once store applied is skipped when replayed; its outputs are acked
(exactly-once: committed) before the store records a turn's offsets; under exactly-once
the stores learn where the loop starts, and the loop resumes where they stand."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.kafka.batching import Batch, decode_batch
from kasper_py.message import TopicPartitionKey
from kasper_py.serdes import serde_for
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.stores.memory import MemoryStore
from kasper_py.turn import PartitionState, TurnEngine
from kasper_py.turn.effectively_once import EffectivelyOnce
from tests.turn_ports import ListPort

CONFIG = Config(name="once", bootstrap_servers="in-memory", input_topics=["in"],
                value_serde="str")
EOS = dataclasses.replace(CONFIG, processing_guarantee="exactly_once")


class Recording(MemoryStore):
    """An effectively-once store: ``flush`` records the offsets it is handed with the
    writes (and in ``log``)."""

    effectively_once = True

    def __init__(self, applied: Mapping[TopicPartitionKey, int] | None = None,
                 log: list[str] | None = None) -> None:
        super().__init__()
        self.applied = dict(applied or {})
        self.log = log if log is not None else []

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        super().flush(next_offsets)
        self.applied.update(next_offsets)
        self.log.append(f"flush {sorted(next_offsets.items())}")

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        return dict(self.applied)


def batch_of(partition: int, offsets: range) -> Batch:
    read = [Message("in", partition, o, None, f"v{o}".encode(), 1_000) for o in offsets]
    return decode_batch(read, serde_for("bytes"), serde_for("str"))


def opened(once: EffectivelyOnce, partition: int, store: MemoryStore) -> list[Any]:
    state = PartitionState(partition, stores={"counts": store})
    once.opened_store(store)
    once.opened(state)
    return [(partition, "counts", store)]


# -- the part alone -----------------------------------------------------------------------


def test_a_replayed_batch_skips_what_the_store_applied_until_a_turn_passes_it() -> None:
    once = EffectivelyOnce("once", exactly_once=False)
    opened(once, 0, Recording({("in", 0): 3}))
    assert once.outputs_first

    replayed = batch_of(0, range(0, 5))
    once.skip_applied(replayed)
    assert [m.offset for m in replayed.by_partition[0]] == [3, 4]

    once.committed({("in", 0): 5})
    later = batch_of(0, range(0, 2))  # below the store's offsets, but no longer skipped
    once.skip_applied(later)
    assert [m.offset for m in later.by_partition[0]] == [0, 1]


def test_the_lowest_applied_offset_of_a_partitions_stores_counts() -> None:
    once = EffectivelyOnce("once", exactly_once=False)
    once.opened_store(Recording({("in", 0): 4}))
    once.opened_store(Recording({("in", 0): 2}))
    batch = batch_of(0, range(0, 4))
    once.skip_applied(batch)
    assert [m.offset for m in batch.by_partition[0]] == [2, 3]


def test_plain_stores_skip_nothing_and_flush_after_the_outputs_are_handed_over() -> None:
    once = EffectivelyOnce("once", exactly_once=True)
    stores = opened(once, 0, MemoryStore())
    assert not once.outputs_first
    assert once.unrecorded(stores, [("in", 0)]) == []
    batch = batch_of(0, range(0, 3))
    once.skip_applied(batch)
    assert len(batch.by_partition[0]) == 3


def test_at_least_once_records_no_starts_and_resumes_nowhere() -> None:
    once = EffectivelyOnce("once", exactly_once=False)
    stores = opened(once, 0, Recording({("in", 0): 3}))
    assert once.unrecorded(stores, [("in", 0), ("in", 1)]) == []
    assert once.resume_from() == {}


def test_exactly_once_records_where_the_loop_starts_in_the_stores_lacking_it() -> None:
    """Each store records the starts of its own partition only; the loop then resumes
    where the stores stand."""
    once = EffectivelyOnce("once", exactly_once=True)
    first, second = Recording(), Recording({("in", 1): 7})
    stores = opened(once, 0, first) + opened(once, 1, second)
    keys = [("in", 0), ("in", 1)]

    assert once.unrecorded(stores, keys) == [("in", 0)]
    once.record(stores, {("in", 0): 5})

    assert (first.applied, second.applied) == ({("in", 0): 5}, {("in", 1): 7})
    assert (first.log, second.log) == (["flush [(('in', 0), 5)]"], [])
    assert once.unrecorded(stores, keys) == []
    assert once.resume_from() == {("in", 0): 5, ("in", 1): 7}

    once.forget_partition(1)
    assert once.resume_from() == {("in", 0): 5}


# -- inside the turn ----------------------------------------------------------------------


class Echo(MessageProcessor):
    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            self.counts.put(message.value, 1)
            sender.send("out", message.value)


class Spec(StoreSpec):
    def __init__(self, store: MemoryStore) -> None:
        self.name, self.store = "counts", store

    def open(self, runtime: StoreRuntime) -> MemoryStore:
        return self.store


def turn_log(config: Config, store_applied: Mapping[TopicPartitionKey, int]
             ) -> tuple[list[str], list[int]]:
    """The order of a turn over offsets 0..3 of partition 0, and the offsets processed."""
    log: list[str] = []
    port = ListPort(log)
    exactly_once = config.exactly_once

    def commit(next_offsets: dict[TopicPartitionKey, int]) -> None:
        if exactly_once:
            port.commit(next_offsets)
        else:
            log.append(f"commit {sorted(next_offsets.items())}")

    def stage(next_offsets: dict[TopicPartitionKey, int]) -> None:
        log.append(f"stage {sorted(next_offsets.items())}")

    engine = TurnEngine(config, port, commit=commit, stage=stage,
                        transactions=port if exactly_once else None,  # type: ignore[arg-type]
                        wall_clock=None)
    store = Recording(store_applied, log)
    engine.open_partition(0, Echo, [Spec(store)], StoreRuntime(config, 0, None))  # type: ignore[arg-type]
    engine.run(batch_of(0, range(0, 4)))
    return log, sorted(int(str(k)[1:]) for k in store.data)


def test_at_least_once_acks_the_outputs_before_the_store_records_the_turns_offsets() -> None:
    """1, 3, 4, 2, 5: produce and wait, then the flush with the offsets, then commit; the
    replayed input the store applied (offsets 0 and 1) is skipped."""
    log, processed = turn_log(CONFIG, {("in", 0): 2})
    assert log == ["produce 2", "acks", "flush [(('in', 0), 4)]",
                   "stage [(('in', 0), 4)]", "acks", "commit [(('in', 0), 4)]"]
    assert processed == [2, 3]


def test_exactly_once_commits_the_transaction_before_the_store_records_its_offsets() -> None:
    """1, 3, 4, 5, 2: the transaction with the outputs and offsets, then the flush (the
    offsets are not staged: the transaction is committed before the flush)."""
    log, _ = turn_log(EOS, {("in", 0): 0})
    assert log == ["begin", "produce 4", "acks", "commit transaction",
                   "flush [(('in', 0), 4)]", "acks"]
