"""The public testing module drives a processor like the loop does, with no broker."""

from __future__ import annotations

import pytest

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    Sender,
)
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message


class WordCount(MessageProcessor):
    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")
        self.partition = context.partition

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = [word for m in messages for word in m.value.split()]
        if "boom" in words:
            raise RuntimeError("boom word")
        counts = self.counts.get_many(set(words))
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        self.counts.put_many(counts)
        for word in sorted(counts):
            sender.send("counts", str(counts[word]), key=word)


def driver() -> ProcessorDriver:
    return ProcessorDriver(WordCount, stores=[MemoryTable("counts")],
                           key_serde="str", value_serde="str")


def test_outputs_state_and_offsets() -> None:
    """Outputs decode with the serdes, stores are flushed, offsets advance per partition."""
    d = driver()
    d.process([make_message("lines", "a b a"), make_message("lines", "c", partition=1)])
    d.process([make_message("lines", "a")])
    assert d.outputs("counts") == [("a", "2"), ("b", "1"), ("c", "1"), ("a", "3")]
    assert d.store("counts").get("a") == 3
    assert d.committed == {("lines", 0): 2, ("lines", 1): 1}


def test_failure_commits_nothing_and_keeps_state() -> None:
    """A raising processor gives ProcessingError; no output, no offsets, no store writes."""
    d = driver()
    d.process([make_message("lines", "a")])
    with pytest.raises(ProcessingError) as info:
        d.process([make_message("lines", "a boom")])
    assert "partition 0" in str(info.value)
    assert "lines[0] offsets 1..1" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert d.committed == {("lines", 0): 1}
    assert d.outputs() == [("a", "1")]
    assert d.store("counts").get("a") == 1


def test_exactly_once_turns_send_on_commit_and_fail_whole() -> None:
    """With processing_guarantee="exactly_once" each turn runs in a transaction of the
    driver's port, sent when it commits: outputs, state and offsets are as
    at-least-once, and a failed turn sends and commits nothing."""
    config = Config(name="testing", bootstrap_servers="in-memory:0", input_topics=("lines",),
                    key_serde="str", value_serde="str", processing_guarantee="exactly_once")
    d = ProcessorDriver(WordCount, config=config, stores=[MemoryTable("counts")])
    assert d.process([make_message("lines", "a b a")]) == d.sent
    with pytest.raises(ProcessingError):
        d.process([make_message("lines", "a boom")])
    d.process([make_message("lines", "a", offset=1)])
    assert d.outputs("counts") == [("a", "2"), ("b", "1"), ("a", "3")]
    assert d.store("counts").get("a") == 3
    assert d.committed == {("lines", 0): 2}


def test_one_processor_per_partition() -> None:
    """Each partition gets its own instance, built once."""
    d = driver()
    d.process([make_message("lines", "x", partition=2), make_message("lines", "y", partition=0)])
    first = d.processor(2)
    d.process([make_message("lines", "x", partition=2)])
    assert d.processor(2) is first
    assert isinstance(first, WordCount) and first.partition == 2
    assert d.store("counts", 2).get("x") == 2


def test_a_failed_turn_drops_the_other_partitions_writes_too() -> None:
    """Partition 0 writes, partition 1 raises: as in the loop, none of the turn's writes
    survive, so replaying the fixed batch counts each word once."""
    d = driver()
    with pytest.raises(ProcessingError):
        d.process([make_message("lines", "x", partition=0),
                   make_message("lines", "boom", partition=1)])
    d.process([make_message("lines", "x", partition=0, offset=0)])
    assert d.store("counts", partition=0).get("x") == 1
    assert d.committed == {("lines", 0): 1}


def test_memory_store_treats_none_as_a_delete() -> None:
    """put(k, None) deletes k, as the Redis, Cassandra and RocksDB stores do."""
    store = MemoryTable("t").open(StoreRuntime(ProcessorDriver(WordCount).config, 0))
    store.put("k", 1)
    store.flush({})
    store.put("k", None)
    assert store.get("k", "absent") == "absent"
    store.flush({})
    assert store.get("k", "absent") == "absent" and list(store.items()) == []
