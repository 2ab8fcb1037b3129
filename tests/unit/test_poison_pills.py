"""``on_process_error="dead_letter"`` without a broker: the real ``TopicProcessor`` on the
in-memory broker, and the testing driver, both running the one turn engine. Poison
messages anywhere in a batch (or everywhere) are found by bisection and dead-lettered
with their original bytes; everything else takes effect once; store failures, limits
and crashes leave the batch uncommitted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from kasper_py import (
    Config,
    DeadLetterLimitError,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    ProduceError,
    Sender,
    StoreError,
    TopicProcessor,
)
from kasper_py.dead_letters import DeadLetterLimits
from kasper_py.exceptions import SimulatedCrash
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message

TOPICS = ("in", "out", "dlq")


def config(**kwargs: Any) -> Config:
    settings: dict[str, Any] = {
        "name": "poison", "bootstrap_servers": "in-memory", "input_topics": ["in"],
        "key_serde": "str", "value_serde": "json", "batch_size": 10,
        "on_process_error": "dead_letter", "dead_letter_topic": "dlq", **kwargs}
    return Config(**settings)


class Poisonable(MessageProcessor):
    """Counts values per key in store "counts" and forwards each value to "out"; a value
    ``{"poison": ...}`` raises ValueError after its count and output were made, so a
    retry must undo them. ``builds`` counts instances (rebuilds show there)."""

    builds: list[int] = []  # noqa: RUF012 - shared on purpose: counts every build
    fail_store_on_build: int | None = None

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")
        self.builds.append(context.partition)
        self.processed_here = 0
        """Plain Python state: lost when the processor is rebuilt."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        if self.fail_store_on_build == len(self.builds):
            raise StoreError("store 'counts' of partition 0: connection refused")
        for message in messages:
            self.counts.put(message.key, self.counts.get(message.key, 0) + 1)
            sender.send("out", message.value, key=message.key)
            self.processed_here += 1
            if "poison" in message.value:
                raise ValueError(f"cannot take {message.value['poison']}")


@pytest.fixture(autouse=True)
def _fresh_builds() -> None:
    Poisonable.builds = []
    Poisonable.fail_store_on_build = None


def broker_with(values: list[dict[str, Any]]) -> InMemoryBroker:
    """One partition of input: ``values`` as JSON with key "k", each with a header."""
    broker = InMemoryBroker()
    for topic in TOPICS:
        broker.create_topic(topic)
    for n, value in enumerate(values):
        text = json.dumps(value)
        broker.produce("in", text, key="k", headers=[("trace", b"t%d" % n)])
    return broker


def run(broker: InMemoryBroker, cfg: Config, store: StoreSpec | None = None,
        observer: Any = None) -> None:
    spec = store or MemoryTable("counts")
    with TopicProcessor(cfg, Poisonable, stores=[spec], clients=broker.clients(cfg),
                        observer=observer) as processor:
        processor.run_loop(until_caught_up=True)


def values(poisoned: set[int], count: int = 10) -> list[dict[str, Any]]:
    return [{"poison": n} if n in poisoned else {"n": n} for n in range(count)]


def good_outputs(broker: InMemoryBroker) -> list[bytes | None]:
    return [m.value for m in broker.read("out")]


@pytest.mark.parametrize("poisoned", [{0}, {9}, {4}, {0, 9}, {3, 4, 5}],
                         ids=["first", "last", "middle", "first-and-last", "a-run"])
def test_poison_messages_go_to_the_dead_letter_topic_and_the_rest_takes_effect_once(
        poisoned: set[int]) -> None:
    """Wherever the poison messages sit in the batch, exactly they reach the dead-letter
    topic (original key, value and headers, then the kasper.* headers), every other
    message's output and store write happens once, in order, and the whole batch is
    committed."""
    broker = broker_with(values(poisoned))
    table = MemoryTable("counts")
    run(broker, config(), table)
    good = [n for n in range(10) if n not in poisoned]
    assert good_outputs(broker) == [b'{"n":%d}' % n for n in good]
    assert table.partitions[0].data == {"k": len(good)}
    letters = broker.read("dlq")
    assert [m.value for m in letters] == [b'{"poison": %d}' % n for n in sorted(poisoned)]
    for letter, n in zip(letters, sorted(poisoned), strict=True):
        assert letter.key == b"k"
        headers = dict(letter.headers)
        assert letter.headers[0] == ("trace", b"t%d" % n)
        assert headers["kasper.error"] == b"cannot take %d" % n
        assert headers["kasper.error.type"] == b"ValueError"
        assert headers["kasper.processor"] == b"poison"
        assert (headers["kasper.source.topic"], headers["kasper.source.partition"],
                headers["kasper.source.offset"]) == (b"in", b"0", str(n).encode())
        assert int(headers["kasper.source.timestamp"]) > 0
    assert broker.committed("poison") == {("in", 0): 10}


def test_every_message_poisoned_dead_letters_all_and_commits() -> None:
    """A batch where every message fails: each one alone reaches the dead-letter topic,
    nothing else is produced or written, and the batch is committed."""
    broker = broker_with(values(set(range(8)), 8))
    table = MemoryTable("counts")
    run(broker, config(), table)
    assert good_outputs(broker) == []
    assert table.partitions[0].data == {}
    assert [dict(m.headers)["kasper.source.offset"] for m in broker.read("dlq")] == [
        str(n).encode() for n in range(8)]
    assert broker.committed("poison") == {("in", 0): 8}


def test_a_store_write_failing_after_the_retries_leaves_the_batch_uncommitted() -> None:
    """The bisection found the poison, then the store's flush fails: StoreError, nothing
    committed, nothing produced (dead letter included), nothing written. A rerun does
    the whole batch once."""
    broker = broker_with(values({2}))
    broker_table = broker.store("counts")
    broker.faults.fail_store_write("counts")
    cfg = config()
    with pytest.raises(StoreError, match=r"write failed"):
        run(broker, cfg, broker_table)
    assert broker.committed("poison") == {}
    assert broker.read("dlq") == [] and broker.read("out") == []
    assert broker.table("counts") == {}
    run(broker, cfg, broker_table)
    assert broker.committed("poison") == {("in", 0): 10}
    assert len(broker.read("dlq")) == 1 and len(broker.read("out")) == 9
    assert broker.table("counts") == {"k": 9}


def test_a_dead_letter_the_broker_refuses_fails_the_turn_uncommitted() -> None:
    """The dead letter's delivery fails (it is the last message the turn hands over):
    ProduceError, the batch stays uncommitted and the dead-letter topic empty; a rerun
    dead-letters the poison and commits the batch."""
    broker = broker_with(values({2}))
    broker.faults.fail_delivery(nth=10)  # 9 outputs, then the dead letter
    cfg = config()
    with pytest.raises(ProduceError, match=r"dlq"):
        run(broker, cfg)
    assert broker.committed("poison") == {}
    assert broker.read("dlq") == []
    run(broker, cfg)
    assert [dict(m.headers)["kasper.source.offset"] for m in broker.read("dlq")] == [b"2"]
    assert broker.committed("poison") == {("in", 0): 10}


def test_a_store_error_raised_during_a_retry_fails_the_turn_uncommitted() -> None:
    """A store failure inside process() on a retry is no poison message's doing: it
    fails the turn with StoreError, and the committed offset does not move."""
    broker = broker_with(values({5}))
    Poisonable.fail_store_on_build = 3  # the second rebuild: inside the bisection
    with pytest.raises(StoreError, match=r"connection refused"):
        run(broker, config())
    assert broker.committed("poison") == {}
    assert broker.read("dlq") == [] and broker.read("out") == []


def test_the_per_turn_limit_stops_the_loop_uncommitted() -> None:
    """More poison messages in one turn than dead_letter_max_per_turn: the loop stops with
    DeadLetterLimitError naming the field, and nothing of the batch is committed or
    produced."""
    broker = broker_with(values({1, 4, 7}))
    with pytest.raises(DeadLetterLimitError, match=r"over dead_letter_max_per_turn=2") as info:
        run(broker, config(dead_letter_max_per_turn=2))
    assert info.value.limit == "dead_letter_max_per_turn"
    assert "in[0] offsets 0..9" in str(info.value)
    assert broker.committed("poison") == {}
    assert broker.read("dlq") == [] and broker.read("out") == []


def test_the_per_minute_limit_counts_committed_turns_and_stops_at_the_turn_past_it() -> None:
    """With batches of 5, two poison messages fit dead_letter_max_per_minute=2 across the
    first two turns (committed); the third poison's turn passes it and stays
    uncommitted: the committed offset is where that batch starts."""
    broker = broker_with(values({1, 6, 11}, 15))
    with pytest.raises(DeadLetterLimitError, match=r"3 in the last minute"):
        run(broker, config(batch_size=5, dead_letter_max_per_minute=2))
    assert broker.committed("poison") == {("in", 0): 10}
    assert len(broker.read("dlq")) == 2


def test_the_ratio_limit_over_the_last_minute() -> None:
    """DeadLetterLimits: the ratio counts committed turns of the last minute and the turn
    in hand; turns older than a minute no longer count."""
    now = [1000.0]
    limits = DeadLetterLimits(config(dead_letter_max_ratio=0.1, dead_letter_max_per_minute=None),
                              clock=lambda: now[0])
    limits.record(0, 95)
    limits.check(1, 5)  # 1 of 100: under
    limits.record(1, 5)
    with pytest.raises(DeadLetterLimitError, match=r"12 of 110 messages") as info:
        limits.check(11, 10)
    assert info.value.limit == "dead_letter_max_ratio"
    now[0] += 61
    limits.check(1, 10)  # the old turns are out of the window: 1 of 10 is at the limit


def test_default_fail_policy_still_stops_on_the_first_exception() -> None:
    """on_process_error="fail" (the default): ProcessingError, nothing committed, no
    bisection (the processor was built once)."""
    broker = broker_with(values({3}))
    with pytest.raises(ProcessingError, match=r"raised ValueError: cannot take 3"):
        run(broker, config(on_process_error="fail", dead_letter_topic=None))
    assert broker.committed("poison") == {}
    assert Poisonable.builds == [0]


def test_exactly_once_with_a_crash_then_restart_outputs_once() -> None:
    """Exactly-once: a process killed after the bisection, before its commit, leaves
    nothing visible; the restart finds the poison again and every output and dead letter
    is committed once."""
    broker = broker_with(values({2, 7}))
    cfg = config(processing_guarantee="exactly_once")
    broker.faults.crash_at("after_flush")
    with pytest.raises(SimulatedCrash):
        run(broker, cfg)
    assert broker.read("out") == [] and broker.read("dlq") == []
    run(broker, cfg)
    assert good_outputs(broker) == [b'{"n":%d}' % n for n in range(10) if n not in (2, 7)]
    assert [dict(m.headers)["kasper.source.offset"] for m in broker.read("dlq")] == [b"2", b"7"]
    assert broker.committed("poison") == {("in", 0): 10}


def test_dead_letters_are_counted_and_logged_with_their_source() -> None:
    """kasper_dead_letters_total{reason="process"} counts them, and each has a warning
    naming its source topic, partition, offset and error."""
    broker = broker_with(values({3, 8}))
    cfg = config()
    observer = PrometheusObserver(cfg)
    with capture_logs() as logs:
        run(broker, cfg, observer=observer)
    observer.close()
    sample = observer.registry.get_sample_value
    assert sample("kasper_dead_letters_total", {"processor": "poison", "reason": "process"}) == 2
    assert sample("kasper_dead_letters_total", {"processor": "poison", "reason": "decode"}) == 0
    lines = [(e["topic"], e["partition"], e["offset"], e["error"], e["error_type"])
             for e in logs if e["event"] == "kasper.dead_letter"]
    assert lines == [("in", 0, 3, "cannot take 3", "ValueError"),
                     ("in", 0, 8, "cannot take 8", "ValueError")]


# -- the testing driver: timers and stream time around a retry ------------------------

class Ticking(MessageProcessor):
    """A wall-clock timer writes "ticks" to its store and sends "tick"; process() sends
    each value to "out" and fails on "bad"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.store = context.store("counts")
        self.context = context
        context.schedule(10, self.tick, "wall_clock")

    def tick(self, timestamp: int, sender: Sender) -> None:
        self.store.put("ticks", self.store.get("ticks", 0) + 1)
        sender.send("tick", b"%d" % timestamp)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value == b"bad":
                raise RuntimeError("bad input")
            sender.send("out", message.value)


def test_a_retry_keeps_what_wall_clock_timers_did_before_the_partition() -> None:
    """A wall-clock timer fires at the start of the turn, before the partition's batch,
    writing to the partition's store and sending: undoing the failed batch keeps both."""
    driver = ProcessorDriver(Ticking, config=config(value_serde="bytes", key_serde="bytes"),
                             stores=[MemoryTable("counts")], wall_clock_start=1_000_000.0)
    first = driver.processor(0)  # schedules the timer, due in 10 s
    assert driver.advance_wall_clock(10)  # it fired in a turn of its own: ticks = 1
    driver._wall_time += 10  # due again: the next turn, which has input, fires it first
    sent = driver.process([make_message("in", value) for value in (b"a", b"bad", b"c")])
    assert [(m.topic, m.value) for m in sent] == [
        ("tick", b"1000020000"), ("out", b"a"), ("out", b"c"), ("dlq", b"bad")]
    assert driver.store("counts").get("ticks") == 2
    assert driver.processor(0) is not first  # rebuilt: plain Python state is gone
    assert driver.committed == {("in", 0): 3}


def test_stream_time_after_a_retry_is_the_newest_event_time_processed() -> None:
    """A failed part moves no stream time; the parts that succeed move it to their newest
    event time, so after the turn it is that of the newest message."""
    driver = ProcessorDriver(Ticking, config=config(value_serde="bytes", key_serde="bytes"),
                             stores=[MemoryTable("counts")], wall_clock_start=1_000_000.0)
    driver.process([make_message("in", b"a", timestamp=1000),
                    make_message("in", b"bad", timestamp=9000),
                    make_message("in", b"c", timestamp=3000)])
    assert driver.stream_time(0) == 3000
    assert driver.outputs("dlq") == [(None, b"bad")]
