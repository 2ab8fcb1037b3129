"""The real ``TopicProcessor`` on ``kasper_py.testing.InMemoryBroker``: crashes at every
step boundary of a turn, failures of each client and store, and the broker's behaviour
as a Kafka (partitioning, offsets, headers, timestamps, errors). No server, no sleeping."""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kasper_py import (
    CommitError,
    Config,
    Message,
    MessageProcessor,
    ProcessorContext,
    ProduceError,
    Sender,
    StoreError,
    TopicError,
    TopicProcessor,
)
from kasper_py.exceptions import KasperError, SimulatedCrash
from kasper_py.kafka.offsets import CommitNote
from kasper_py.kafka.partitioner import murmur2
from kasper_py.message import OutgoingMessage
from kasper_py.observability.observe import LoopObserver
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.testing import Faults, InMemoryBroker
from kasper_py.testing.faults import CRASH_STEPS

GROUP = "counter"
CONFIG = Config(name=GROUP, bootstrap_servers="in-memory", input_topics=["in"],
                key_serde="str", value_serde="str", batch_size=4)
KEYS = ("k0", "k1", "k2", "k3", "k4")  # murmur2 puts k0-k2 in partition 1, k3-k4 in 0


def coordinates(message: Message) -> str:
    return f"{message.topic}:{message.partition}:{message.offset}"


class Counter(MessageProcessor):
    """Counts inputs per key in its store and sends each input's coordinates to "out";
    notes what each turn processed in ``turns`` (a turn starts at "before_process")."""

    def __init__(self, context: ProcessorContext, turns: list[set[str]]) -> None:
        self.counts = context.store("counts")
        self.turns = turns

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.counts.get_many({m.key for m in messages})
        for m in messages:
            counts[m.key] = counts.get(m.key, 0) + 1
            sender.send("out", coordinates(m), key=m.key)
            self.turns[-1].add(coordinates(m))
        self.counts.put_many(counts)


def broker_with_input(count: int = 30) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    broker.create_topic("out", partitions=2)
    add_input(broker, count)
    return broker


def add_input(broker: InMemoryBroker, count: int) -> None:
    for _ in range(count):
        n = len(broker.read("in"))
        broker.produce("in", f"v{n}", key=KEYS[n % len(KEYS)])


def start(broker: InMemoryBroker, spec: StoreSpec, turns: list[set[str]] | None = None, *,
          config: Config = CONFIG, on_step: Callable[[str], None] | None = None,
          builds: list[int] | None = None, observer: LoopObserver | None = None
          ) -> TopicProcessor:
    """One process, not yet running: ``turns`` gets what each turn processed,
    ``on_step`` is called before the broker's fault hook, ``builds`` gets the partition
    of every processor the factory builds."""
    turns = [] if turns is None else turns
    clients = broker.clients(config)
    broker_hook = clients.on_step

    def hook(step: str) -> None:
        if step == "before_process":
            turns.append(set())
        if on_step is not None:
            on_step(step)
        broker_hook(step)

    def factory(context: ProcessorContext) -> Counter:
        if builds is not None:
            builds.append(context.partition)
        return Counter(context, turns)

    clients.on_step = hook
    return TopicProcessor(config, factory, stores=[spec], clients=clients, observer=observer)


def run(broker: InMemoryBroker, spec: StoreSpec, turns: list[set[str]] | None = None,
        **options: Any) -> None:
    """One process (``start``'s options) run until caught up, then closed."""
    processor = start(broker, spec, turns, **options)
    processor.run_loop(until_caught_up=True)
    processor.close()


def end_offsets(broker: InMemoryBroker) -> dict[tuple[str, int], int]:
    return {("in", p): broker.watermarks("in", p)[1] for p in (0, 1)}


def assert_never_backwards(broker: InMemoryBroker) -> None:
    last: dict[tuple[str, int], int] = {}
    for commit in broker.commits(GROUP):
        tp = (commit.topic, commit.partition)
        assert commit.offset >= last.get(tp, 0), f"{tp} moved back to {commit.offset}"
        last[tp] = commit.offset


def assert_every_input_has_output(broker: InMemoryBroker) -> collections.Counter[str]:
    outputs = collections.Counter(m.value.decode() for m in broker.read("out"))
    assert set(outputs) == {coordinates(m) for m in broker.read("in")}
    return outputs


# -- crashes ----------------------------------------------------------------------------


def crash_in_turn_3(broker: InMemoryBroker, spec: StoreSpec, step: str,
                    runner: Callable[..., None] = run) -> set[str]:
    """``runner`` crashed at ``step`` of its third turn: the crashed turn's inputs (none
    when it crashed before processing them)."""
    broker.faults.crash_at(step, turn=3)
    turns: list[set[str]] = []
    with pytest.raises(SimulatedCrash, match=step):
        runner(broker, spec, turns)
    assert broker.faults.armed() == []
    assert len(turns) == 3
    assert bool(turns[-1]) == (step != "before_process")
    return turns[-1]


@pytest.mark.parametrize("effectively_once", [False, True], ids=["plain", "effectively-once"])
@pytest.mark.parametrize("step", CRASH_STEPS)
def test_crash_at_each_step_then_restart(step: str, effectively_once: bool) -> None:
    """A process killed at any step boundary of turn 3 and restarted on the same broker:
    every input has its output, duplicates come only from the crashed turn, committed
    offsets never move back, and an effectively-once store's counts are exact."""
    broker = broker_with_input()
    spec = broker.store("counts", effectively_once=effectively_once)
    crashed_turn = crash_in_turn_3(broker, spec, step)

    run(broker, spec)

    outputs = assert_every_input_has_output(broker)
    duplicated = {c for c, n in outputs.items() if n > 1}
    assert duplicated <= crashed_turn
    assert_never_backwards(broker)
    assert broker.committed(GROUP) == end_offsets(broker)
    key_of = {coordinates(m): m.key.decode() for m in broker.read("in")}
    exact = collections.Counter(key_of.values())
    counts = broker.table("counts")
    if effectively_once:
        assert counts == exact
    else:
        assert all(counts[key] >= exact[key] for key in exact)
    # Where replays show: acked output and flushed plain writes of the uncommitted
    # turn happen twice; an effectively-once store skips the replay (its outputs were
    # acked before its flush), so nothing shows twice.
    replayed = not effectively_once and step in ("after_flush", "after_produce")
    assert duplicated == (crashed_turn if replayed and step == "after_produce" else set())
    extra = collections.Counter(key_of[c] for c in crashed_turn) if replayed else {}
    assert counts == exact + collections.Counter(extra)


def test_crash_loses_unacked_output_and_kills_the_clients() -> None:
    """Output queued but not acked when the process dies is lost, and the dead
    process's clients refuse to be used again."""
    broker = broker_with_input(4)
    clients = broker.clients(CONFIG)
    broker.faults.crash_at("after_process")
    clients.producer.produce([OutgoingMessage("out", b"queued").record()])
    with pytest.raises(SimulatedCrash):
        clients.on_step("after_process")
    assert broker.read("out") == []
    with pytest.raises(KasperError, match="crashed"):
        clients.consumer.consume(1, 0.1)


# -- failures ---------------------------------------------------------------------------


FAILURES: dict[str, tuple[Callable[[Faults], None], type[KasperError], str]] = {
    "produce": (lambda f: f.fail_produce(nth=2), ProduceError,
                "cannot produce to 'out': injected by InMemoryBroker.faults"),
    "delivery": (lambda f: f.fail_delivery(nth=2), ProduceError,
                 r"delivery to out\[\d\] failed: injected by InMemoryBroker.faults"),
    # the restarted loop's first commit is its start note's; the second is a turn's
    "commit": (lambda f: f.fail_commit(nth=2), CommitError,
               "commit failed: injected by InMemoryBroker.faults"),
    "store": (lambda f: f.fail_store_write("counts"), StoreError,
              r"store 'counts' of partition \d: write failed: injected by InMemoryBroker"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_failure_stops_the_loop_uncommitted(failure: str) -> None:
    """A failed produce, delivery, commit or store write stops the loop with its own
    error naming the uncommitted batch; committed offsets do not move, and a restart
    completes the work."""
    arm, error, text = FAILURES[failure]
    broker = broker_with_input(10)
    spec = broker.store("counts")
    run(broker, spec)
    before = broker.committed(GROUP)
    add_input(broker, 10)
    arm(broker.faults)
    with pytest.raises(error) as info:
        run(broker, spec)
    assert re.search(text, str(info.value)), str(info.value)
    assert re.search(r"\[batch not committed: in\[\d\] offsets \d+\.\.\d+", str(info.value))
    assert broker.committed(GROUP) == before
    assert broker.faults.armed() == []

    run(broker, spec)

    assert_every_input_has_output(broker)
    assert broker.committed(GROUP) == end_offsets(broker)


def test_store_write_fault_fires_only_on_a_write() -> None:
    """A flush with nothing to write makes no write, so an armed store fault waits."""
    broker = InMemoryBroker()
    store = broker.store("counts").open(_runtime(0))
    broker.faults.fail_store_write("counts")
    store.flush({})
    assert broker.faults.armed() == ["store:counts"]
    store.put("a", 1)
    with pytest.raises(StoreError, match="partition 0: write failed"):
        store.flush({})
    assert broker.table("counts") == {}


def _runtime(partition: int) -> StoreRuntime:
    return StoreRuntime(CONFIG, partition)


def test_faults_are_validated() -> None:
    """Unknown steps and counts below one are refused when armed."""
    faults = InMemoryBroker().faults
    with pytest.raises(ValueError, match="after_commit"):
        faults.crash_at("after_lunch")
    with pytest.raises(ValueError, match="nth must be an int >= 1"):
        faults.fail_produce(nth=0)
    faults.fail_commit(times=2)
    faults.crash_at("after_flush", turn=2)
    assert faults.armed() == ["commit", "crash:after_flush"]
    faults.clear()
    assert faults.armed() == []


# -- the loop on the broker ---------------------------------------------------------------


class Echo(MessageProcessor):
    """Sends every value on to "out" with its headers; keeps what it saw."""

    seen: list[Message]

    def __init__(self, context: ProcessorContext) -> None:
        Echo.seen = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        Echo.seen += messages
        for m in messages:
            sender.send("out", m.value, key=m.key, headers=m.headers)


def one_partition_broker(*topics: str) -> InMemoryBroker:
    broker = InMemoryBroker()
    for topic in ("in", "out", *topics):
        broker.create_topic(topic)
    return broker


def test_dead_letters_through_the_loop() -> None:
    """An undecodable record goes to the dead-letter topic with its original bytes and
    headers plus the error headers, and its offset is committed."""
    broker = one_partition_broker("dlq")
    config = Config(name="dl", bootstrap_servers="in-memory", input_topics=["in"],
                    value_serde="json", on_decode_error="dead_letter", dead_letter_topic="dlq")
    broker.produce("in", '{"a": 1}')
    broker.produce("in", b"{not json", headers=[("trace", b"t1")])
    broker.produce("in", '{"a": 2}')
    with TopicProcessor(config, Echo, clients=broker.clients(config)) as processor:
        processor.run_loop(until_caught_up=True)
    assert [m.value for m in Echo.seen] == [{"a": 1}, {"a": 2}]
    [dead] = broker.read("dlq")
    assert dead.value == b"{not json"
    headers = dict(dead.headers)
    assert dead.headers[0] == ("trace", b"t1")
    assert headers["kasper.source.offset"] == b"1"
    assert headers["kasper.error"].startswith(b"json serde: invalid JSON")
    assert broker.committed("dl") == {("in", 0): 3}


def test_headers_and_timestamps_reach_process_and_output() -> None:
    """Input headers and timestamps reach process(); output headers reach the log."""
    broker = one_partition_broker()
    broker.produce("in", b"a", headers=[("h", b"v"), ("empty", None)], timestamp=1234)
    broker.produce("in", b"b")
    with TopicProcessor(CONFIG, Echo, clients=broker.clients(CONFIG)) as processor:
        processor.run_loop(until_caught_up=True)
    first, second = Echo.seen
    assert (first.headers, first.timestamp) == ((("h", b"v"), ("empty", None)), 1234)
    assert second.headers == ()
    assert second.timestamp is not None and second.timestamp > 1234
    assert broker.read("out")[0].headers == (("h", b"v"), ("empty", None))


def test_has_consumed_all_and_until_caught_up() -> None:
    """until_caught_up returns at the high watermarks; new input makes the processor
    behind again, and a second run catches up."""
    broker = broker_with_input(5)
    processor = TopicProcessor(CONFIG, Echo, clients=broker.clients(CONFIG))
    assert not processor.has_consumed_all()
    processor.run_loop(until_caught_up=True)
    assert processor.has_consumed_all()
    add_input(broker, 3)
    assert not processor.has_consumed_all()
    processor.run_loop(until_caught_up=True)
    assert processor.has_consumed_all()
    processor.close()
    assert len(broker.read("out")) == 8
    assert broker.committed(GROUP) == end_offsets(broker)


def test_many_turns_take_no_batch_wait() -> None:
    """300 one-message turns at the default batch_wait of 1 s: the broker's clock moves
    on when a consume finds too little, so this runs in milliseconds, not minutes."""
    config = Config(name="fast", bootstrap_servers="in-memory", input_topics=["in"],
                    batch_size=1)
    assert config.batch_wait == 1.0
    broker = one_partition_broker()
    for n in range(300):
        broker.produce("in", str(n))
    with TopicProcessor(config, Echo, clients=broker.clients(config)) as processor:
        processor.run_loop(until_caught_up=True)
    assert [m.value for m in broker.read("out")] == [str(n).encode() for n in range(300)]
    assert len(broker.commits("fast")) >= 300


def test_loop_in_a_thread_until_closed() -> None:
    """run_loop() without until_caught_up idles on the broker and stops on close()."""
    broker = one_partition_broker()
    processor = TopicProcessor(CONFIG, Echo, clients=broker.clients(CONFIG))
    loop = threading.Thread(target=processor.run_loop)
    loop.start()
    broker.produce("in", b"x")
    deadline = time.monotonic() + 10
    while not broker.read("out") and time.monotonic() < deadline:
        time.sleep(0.01)
    processor.close(timeout=10)
    loop.join(10)
    assert not loop.is_alive()
    assert [m.value for m in broker.read("out")] == [b"x"]
    assert CommitNote.decode(broker.commits(GROUP)[-1].metadata).state == "stopped"


def test_commit_notes_are_kept() -> None:
    """Every commit keeps the loop's note: running after turns, stopped on close."""
    broker = broker_with_input(4)
    run(broker, broker.store("counts"))
    notes = [CommitNote.decode(c.metadata) for c in broker.commits(GROUP)]
    assert all(note is not None for note in notes)
    assert next(n.state for n in notes if n is not None) == "running"
    assert notes[-1] is not None and notes[-1].state == "stopped"


def test_latest_starts_at_the_end() -> None:
    """With auto_offset_reset='latest' and nothing committed, earlier input is skipped."""
    broker = one_partition_broker()
    broker.produce("in", b"old")
    config = Config(name="late", bootstrap_servers="in-memory", input_topics=["in"],
                    auto_offset_reset="latest")
    processor = TopicProcessor(config, Echo, clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    broker.produce("in", b"new")
    assert not processor.has_consumed_all()
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert [m.value for m in broker.read("out")] == [b"new"]


# -- the broker as a Kafka ------------------------------------------------------------------


def test_input_topic_errors_match_the_real_consumer() -> None:
    """A missing input topic, or input topics with different partition counts, raise
    TopicError at start, worded like InputConsumer's."""
    broker = InMemoryBroker()
    with pytest.raises(TopicError, match="input topic 'in': does not exist"):
        TopicProcessor(CONFIG, Echo, clients=broker.clients(CONFIG)).run_loop()
    broker.create_topic("in", 2)
    broker.create_topic("other", 3)
    config = Config(name="two", bootstrap_servers="in-memory", input_topics=["in", "other"])
    with pytest.raises(TopicError, match=r"same partition count .* found in=2, other=3"):
        TopicProcessor(config, Echo, clients=broker.clients(config)).run_loop()
    with pytest.raises(TopicError, match="already exists"):
        broker.create_topic("in")


class Misspelt(MessageProcessor):
    """Sends every value to "out", and to "ordres" (a typo of a topic name)."""

    def __init__(self, context: ProcessorContext) -> None:
        pass

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send("out", m.value)
            sender.send("ordres", m.value)


def test_a_send_to_a_missing_topic_fails_the_turn_naming_topic_and_processor() -> None:
    """Output topics are not created on demand: the first turn sending to one that does
    not exist fails with a TopicError naming the topic and the processor, before any of
    its output is produced (not even to the topic that exists), and commits nothing."""
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.create_topic("out")
    broker.produce("in", b"x")
    with pytest.raises(TopicError) as failed:
        TopicProcessor(CONFIG, Misspelt, clients=broker.clients(CONFIG)).run_loop()
    assert "'ordres' (does not exist)" in str(failed.value)
    assert f"processor {GROUP!r}" in str(failed.value)
    assert failed.value.uncommitted == "in[0] offsets 0..0"
    assert broker.committed(GROUP) == {}
    assert broker.read("out") == []
    with pytest.raises(TopicError, match="topic 'ordres' does not exist"):
        broker.read("ordres")
    with pytest.raises(ProduceError, match="Unknown partition"):
        broker.produce("in", b"y", partition=1)


def test_murmur2_matches_the_java_client() -> None:
    """Kafka's UtilsTest.testMurmur2 vectors, so keyed messages land where Java's
    producer (and the loop's, murmur2_random) would put them."""
    vectors = {b"21": -973932308, b"foobar": -790332482, b"": 275646681,
               b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
               b"abc": 479470107}
    assert {data: murmur2(data) for data in vectors} == vectors


def test_partitioning() -> None:
    """Explicit partition wins, keys hash with murmur2, no key goes round-robin."""
    broker = InMemoryBroker()
    broker.create_topic("t", 3)
    assert broker.produce("t", b"v", key="foobar").partition == (-790332482 & 0x7FFFFFFF) % 3
    assert broker.produce("t", b"v", key="foobar", partition=2).partition == 2
    assert [broker.produce("t", b"v").partition for _ in range(4)] == [0, 1, 2, 0]
    assert [m.offset for m in broker.read("t", 2)] == [0, 1]
    assert [m.value for m in broker.read("t")] == [b"v"] * 6


# -- the docs' example -------------------------------------------------------------------


def test_testing_docs_example_runs() -> None:
    """The crash-injection example of docs/testing.md is run as written."""
    page = (Path(__file__).parents[2] / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    [example] = [block for block in blocks if "crash_at(" in block]
    exec(compile(example, "docs/testing.md", "exec"), {})  # our own docs' example
