"""The loop on a real broker: outputs, commits, restarts, and every failure path."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from confluent_kafka import TopicPartition

from kasper_py import (
    CommitError,
    Config,
    KasperError,
    Message,
    MessageProcessor,
    ProcessingError,
    ProcessorContext,
    ProduceError,
    Sender,
    StoreError,
    TopicError,
    TopicProcessor,
)
from kasper_py.kafka.offsets import CommitNote
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.memory import MemoryStore, MemoryTable
from tests.kafka_clients import Consumer, Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = pytest.mark.integration
WORKER = Path(__file__).with_name("passthrough_worker.py")


class Upper(MessageProcessor):
    """Sends each value upper-cased to `output`, on the input's partition."""

    def __init__(self, context: ProcessorContext, output: str, fail_on: bytes | None = None,
                 big: bool = False) -> None:
        self.output, self.fail_on, self.big = output, fail_on, big

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value == self.fail_on:
                raise ValueError(f"cannot handle {message.value!r}")
            value = message.value.upper() * (500 if self.big else 1)
            sender.send(self.output, value, key=message.key, partition=message.partition)


def config(bootstrap: str, name: str, topics: list[str], **kwargs: object) -> Config:
    values: dict[str, object] = {"batch_size": 100, "batch_wait": 0.2}
    values.update(kwargs)
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=topics, **values)  # type: ignore[arg-type]


def run(cfg: Config, output: str, **kwargs: object) -> None:
    processor = TopicProcessor(cfg, lambda c: Upper(c, output, **kwargs))  # type: ignore[arg-type]
    try:
        processor.run_loop(until_caught_up=True)
    finally:
        processor.close()


def test_happy_path_outputs_exactly_and_commits(bootstrap, new_topic, kafka, unique_name) -> None:
    """Every input yields exactly one output on its partition; commits reach the end."""
    source, output = new_topic("in", partitions=3), new_topic("out", partitions=3)
    sent = {p: [f"p{p}-m{i}".encode() for i in range(120 + p)] for p in range(3)}
    for p, values in sent.items():
        kafka.produce(source, values, partition=p)
    name = unique_name("happy")
    run(config(bootstrap, name, [source]), output)
    received = kafka.read_all(output)
    assert Counter((m.partition(), m.value()) for m in received) == Counter(
        (p, v.upper()) for p, values in sent.items() for v in values)
    for p in range(3):
        in_order = [m.value() for m in received if m.partition() == p]
        assert in_order == [v.upper() for v in sent[p]]
    assert kafka.committed(name, source, 3) == {0: 120, 1: 121, 2: 122}


def test_restart_resumes_from_committed_offsets(bootstrap, new_topic, kafka, unique_name) -> None:
    """A second run with the same name processes only what arrived after the first."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("restart")
    kafka.produce(source, [b"a%d" % i for i in range(50)])
    run(config(bootstrap, name, [source]), output)
    kafka.produce(source, [b"b%d" % i for i in range(30)])
    run(config(bootstrap, name, [source]), output)
    values = [m.value() for m in kafka.read_all(output)]
    assert values == [b"A%d" % i for i in range(50)] + [b"B%d" % i for i in range(30)]
    assert kafka.committed(name, source) == {0: 80}


def test_processor_error_leaves_offsets_unchanged(bootstrap, new_topic, kafka, unique_name) -> None:
    """process() raising stops the loop with ProcessingError; that batch is not committed."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("raises")
    kafka.produce(source, [b"ok%d" % i for i in range(10)])
    run(config(bootstrap, name, [source]), output)
    kafka.produce(source, [b"x", b"poison", b"y"])
    with pytest.raises(ProcessingError) as info:
        run(config(bootstrap, name, [source]), output, fail_on=b"poison")
    text = str(info.value)
    assert "partition 0" in text and "ValueError" in text
    assert f"{source}[0] offsets 10..12" in text
    assert isinstance(info.value.__cause__, ValueError)
    assert kafka.committed(name, source) == {0: 10}
    # Fixed code replays the uncommitted batch and reaches the end.
    run(config(bootstrap, name, [source]), output)
    assert kafka.committed(name, source) == {0: 13}
    assert [m.value() for m in kafka.read_all(output)][-3:] == [b"X", b"POISON", b"Y"]


def test_delivery_failure_is_not_committed(bootstrap, new_topic, kafka, unique_name) -> None:
    """An output the broker rejects (over max.message.bytes) fails the turn uncommitted."""
    source = new_topic("in")
    output = new_topic("out", **{"max.message.bytes": "1000"})
    name = unique_name("delivery")
    kafka.produce(source, [b"0123456789"] * 5)
    with pytest.raises(ProduceError) as info:
        run(config(bootstrap, name, [source]), output, big=True)
    assert f"delivery to {output}" in str(info.value)
    assert f"{source}[0] offsets 0..4" in str(info.value)
    assert info.value.code is not None
    assert kafka.committed(name, source) == {0: None}


def test_commit_failure_raises_commit_error(bootstrap, new_topic, kafka, unique_name) -> None:
    """If the group is held by another active member, the commit is refused: CommitError."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("commit")
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                       "session.timeout.ms": 30000})
    member.subscribe([new_topic("other")])
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    try:
        kafka.produce(source, [b"a", b"b"])
        with pytest.raises(CommitError) as info:
            run(config(bootstrap, name, [source]), output)
        assert "commit" in str(info.value) and info.value.code is not None
    finally:
        member.close()
    assert kafka.committed(name, source) == {0: None}


def test_mismatched_partition_counts_fail_at_start(bootstrap, new_topic, unique_name) -> None:
    """Input topics with different partition counts are refused before anything runs."""
    a, b = new_topic("a", partitions=2), new_topic("b", partitions=3)
    processor = TopicProcessor(config(bootstrap, unique_name("mismatch"), [a, b]),
                               lambda c: Upper(c, "unused"))
    with pytest.raises(TopicError) as info:
        processor.run_loop()
    assert f"{a}=2" in str(info.value) and f"{b}=3" in str(info.value)
    assert "same partition count" in str(info.value)


def test_missing_topic_and_partition_are_named(bootstrap, new_topic, unique_name) -> None:
    """A missing input topic, or an input partition past the count, is named in the error."""
    missing = unique_name("missing")
    processor = TopicProcessor(config(bootstrap, unique_name("m"), [missing]),
                               lambda c: Upper(c, "unused"))
    with pytest.raises(TopicError, match=f"input topic '{missing}': does not exist"):
        processor.run_loop()
    source = new_topic("in", partitions=2)
    processor = TopicProcessor(config(bootstrap, unique_name("m"), [source], input_partitions=[5]),
                               lambda c: Upper(c, "unused"))
    with pytest.raises(TopicError, match=r"input_partitions \[5\] do not exist"):
        processor.run_loop()


def test_partition_subset_and_copartitioned_join(bootstrap, new_topic, kafka, unique_name) -> None:
    """Only the configured partitions are consumed, and each call sees every input topic."""
    left, right = new_topic("left", partitions=2), new_topic("right", partitions=2)
    seen: list[tuple[int, list[str]]] = []

    class Recorder(MessageProcessor):
        def __init__(self, context: ProcessorContext) -> None:
            self.partition = context.partition

        def process(self, messages: list[Message], sender: Sender) -> None:
            seen.append((self.partition, sorted(m.topic for m in messages)))

    kafka.produce(left, [b"l"], partition=1)
    kafka.produce(right, [b"r"], partition=1)
    kafka.produce(left, [b"skipped"], partition=0)
    name = unique_name("subset")
    processor = TopicProcessor(
        config(bootstrap, name, [left, right], input_partitions=[1], batch_wait=1.0), Recorder)
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert {p for p, _ in seen} == {1}
    assert sorted(t for _, topics in seen for t in topics) == sorted([left, right])
    assert kafka.committed(name, left, 2) == {0: None, 1: 1}


def test_close_from_another_thread_commits_batch_in_hand(bootstrap, new_topic, kafka,
                                                          unique_name) -> None:
    """close() from another thread lets the current turn finish and commit, then stops."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("close")
    kafka.produce(source, [b"v%d" % i for i in range(20)])
    started = threading.Event()

    class Slow(MessageProcessor):
        def __init__(self, context: ProcessorContext) -> None:
            pass

        def process(self, messages: list[Message], sender: Sender) -> None:
            started.set()
            time.sleep(1.0)
            for m in messages:
                sender.send(output, m.value)

    processor = TopicProcessor(config(bootstrap, name, [source], batch_size=1000,
                                      batch_wait=0.5), Slow)
    loop = threading.Thread(target=processor.run_loop)
    loop.start()
    assert started.wait(30)
    processor.close(timeout=30)
    loop.join(30)
    assert not loop.is_alive()
    assert kafka.committed(name, source) == {0: 20}
    assert len(kafka.read_all(output)) == 20


def test_kill_minus_nine_loses_nothing(bootstrap, new_topic, kafka, unique_name) -> None:
    """SIGKILL at random moments: every input gets its output, and duplicates are at most
    one batch per kill."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    name, batch_size, kills = unique_name("kill"), 200, 3
    values = [b"m%06d" % i for i in range(20_000)]
    kafka.produce(source, [(v, v) for v in values])
    args = [sys.executable, str(WORKER), bootstrap, name, source, output, str(batch_size)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rng = random.Random()
    committed_at_kill = []
    for _ in range(kills):
        # ~30 ms per partition batch: a run takes seconds, so a kill lands mid-run.
        worker = subprocess.Popen([*args, "--pause", "0.03"], env=env, stdout=subprocess.PIPE)
        assert worker.stdout is not None and worker.stdout.readline() == b"started\n"
        time.sleep(rng.uniform(0.3, 1.2))
        worker.kill()
        worker.wait(30)
        committed_at_kill.append(sum(o or 0 for o in kafka.committed(name, source, 2).values()))
    # The kills landed mid-run: some input was committed, not all of it.
    assert any(0 < c < len(values) for c in committed_at_kill), committed_at_kill
    subprocess.run([*args, "--until-caught-up"], env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    produced = Counter(m.value() for m in kafka.read_all(output, timeout=60))
    assert set(produced) == set(values)
    duplicates = sum(produced.values()) - len(values)
    # Each kill can replay one uncommitted batch of at most batch_size messages.
    assert duplicates <= kills * batch_size, duplicates
    assert sum(kafka.committed(name, source, 2).values()) == len(values)


def test_json_serde_end_to_end(bootstrap, new_topic, kafka, unique_name) -> None:
    """Values decode as JSON on the way in and encode on the way out."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [json.dumps({"n": i}).encode() for i in range(5)])

    class Double(MessageProcessor):
        def __init__(self, context: ProcessorContext) -> None:
            pass

        def process(self, messages: list[Message], sender: Sender) -> None:
            for m in messages:
                sender.send(output, {"n": m.value["n"] * 2})

    processor = TopicProcessor(config(bootstrap, unique_name("json"), [source],
                                      value_serde="json"), Double)
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert [json.loads(m.value()) for m in kafka.read_all(output)] == [
        {"n": 2 * i} for i in range(5)]




def test_effectively_once_store_must_be_the_only_store(bootstrap, new_topic, kafka,
                                                       unique_name) -> None:
    """Replay skipping would cover the other store's writes too: refused at start, with
    nothing processed or committed."""

    class ExactTable(MemoryTable):
        def open(self, runtime: StoreRuntime) -> MemoryStore:
            store = super().open(runtime)
            store.effectively_once = True
            return store

    source = new_topic("in")
    name = unique_name("eo-mix")
    kafka.produce(source, [b"a", b"b"])
    processor = TopicProcessor(config(bootstrap, name, [source]), lambda c: Upper(c, source),
                               stores=[ExactTable("exact"), MemoryTable("plain")])
    only_store = (r"store 'exact' is effectively-once, so it must be the processor's only "
                  r"store \(got \['exact', 'plain'\]\)")
    with pytest.raises(StoreError, match=only_store):
        processor.run_loop(until_caught_up=True)
    assert kafka.committed(name, source) == {0: None}


def test_metrics_port_serves_metrics_and_health_while_running(bootstrap, new_topic, kafka,
                                                               unique_name) -> None:
    """With metrics_port set and no observer given, the loop serves /metrics and /health
    itself, counts what it consumed, and frees the port on close()."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("served")
    kafka.produce(source, [b"v%d" % i for i in range(30)])
    processor = TopicProcessor(config(bootstrap, name, [source], metrics_port=port),
                               lambda c: Upper(c, output))
    processor.run_loop(until_caught_up=True)
    base = f"http://127.0.0.1:{port}"
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    line = (f'kasper_messages_consumed_total{{partition="0",processor="{name}",'
            f'topic="{source}"}} 30.0')
    assert line in metrics
    assert urllib.request.urlopen(f"{base}/health/ready", timeout=10).status == 200
    processor.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/metrics", timeout=5)


class SignalOnce(Upper):
    """Upper, sending ``signum`` to its own process while handling the first batch."""

    def __init__(self, context: ProcessorContext, output: str, signum: int) -> None:
        super().__init__(context, output)
        self.signum, self.batches = signum, []

    def process(self, messages: list[Message], sender: Sender) -> None:
        if not self.batches:
            os.kill(os.getpid(), self.signum)  # the handler runs before the next bytecode
        self.batches.append((messages[0].offset, messages[-1].offset))
        super().process(messages, sender)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_until_stopped_commits_the_batch_in_hand_on_a_signal(
        bootstrap, new_topic, kafka, unique_name, signum) -> None:
    """A signal mid-batch: that batch is produced and committed, no further batch is
    taken, the processor is closed, the signal's name is returned and the previous
    handler is back."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("signal")
    kafka.produce(source, [b"m%d" % i for i in range(500)])
    opened: list[SignalOnce] = []

    def factory(context: ProcessorContext) -> SignalOnce:
        opened.append(SignalOnce(context, output, signum))
        return opened[-1]

    before = signal.getsignal(signum)
    processor = TopicProcessor(config(bootstrap, name, [source]), factory)
    assert processor.run_until_stopped() == signal.Signals(signum).name
    assert len(opened[0].batches) == 1 and opened[0].batches[0][0] == 0
    end = opened[0].batches[0][1] + 1
    assert 0 < end <= 100
    assert kafka.committed(name, source) == {0: end}
    assert [m.value() for m in kafka.read_all(output)] == [b"M%d" % i for i in range(end)]
    assert signal.getsignal(signum) is before
    with pytest.raises(KasperError, match="is closed"):
        processor.run_loop()


def test_run_until_stopped_returns_none_when_caught_up_and_refuses_other_threads(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """Ending on its own returns None with the processor still usable until the ``with``
    block closes it; from a thread other than the main one it refuses, naming why."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("caught-up")
    kafka.produce(source, [b"a", b"b"])
    with TopicProcessor(config(bootstrap, name, [source]), lambda c: Upper(c, output)) as p:
        assert p.run_until_stopped(until_caught_up=True) is None
        assert p.has_consumed_all()
        errors: list[BaseException] = []
        worker = threading.Thread(target=lambda: _capture(errors, p.run_until_stopped))
        worker.start()
        worker.join(30)
    assert len(errors) == 1 and isinstance(errors[0], KasperError)
    assert "must be called from the main thread" in str(errors[0])
    assert kafka.committed(name, source) == {0: 2}
    with pytest.raises(KasperError, match="is closed"):
        p.run_loop()


def _capture(errors: list[BaseException], call: Callable[[], object]) -> None:
    try:
        call()
    except BaseException as exc:
        errors.append(exc)


class MixedSends(MessageProcessor):
    """For each input, sends one keyed message to partition 0 of ``output``: every
    third one with headers, every fifth one by explicit partition."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            n = int(message.value)
            headers = {"n": str(n)} if n % 3 == 0 else None
            partition = 0 if n % 5 == 0 else None
            sender.send(self.output, message.value, key=b"same-key", partition=partition,
                        headers=headers)


def test_output_keeps_send_order_when_headers_and_partitions_mix(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """Messages for one partition arrive in the order process() sent them, whether
    they carry headers, an explicit partition or only a key."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"%d" % i for i in range(60)])
    cfg = config(bootstrap, unique_name("order"), [source])
    with TopicProcessor(cfg, lambda c: MixedSends(c, output)) as processor:
        processor.run_loop(until_caught_up=True)
    assert [m.value() for m in kafka.read_all(output)] == [b"%d" % i for i in range(60)]


def committed_note(bootstrap: str, group: str, topic: str) -> tuple[int, CommitNote | None]:
    """The group's committed offset of topic[0] and the kasper note stored with it."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        reader.close()
    return tp.offset, CommitNote.decode(tp.metadata)


def test_idle_loop_heartbeats_its_offsets_and_says_when_it_stopped(
        bootstrap, new_topic, kafka, unique_name, monkeypatch) -> None:
    """Idle, a loop re-commits the same offsets with a fresher "running" note (so tools
    know it runs although it is no group member); close() leaves a "stopped" note."""
    monkeypatch.setattr("kasper_py.loop.committer.HEARTBEAT_SECONDS", 0.5)
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("heartbeat")
    kafka.produce(source, [b"a", b"b"])
    processor = TopicProcessor(config(bootstrap, name, [source]), lambda c: Upper(c, output))
    worker = threading.Thread(target=processor.run_loop)
    worker.start()
    try:
        wait_for(lambda: committed_note(bootstrap, name, source)[0] == 2, "the second commit",
                 timeout=30)
        offset, first = committed_note(bootstrap, name, source)
        assert first is not None and first.state == "running" and first.pid == os.getpid()
        wait_for(lambda: (committed_note(bootstrap, name, source)[1] or first).at > first.at,
                 "a newer commit note", timeout=30)
        offset, later = committed_note(bootstrap, name, source)
        assert offset == 2 and later is not None and later.state == "running"
    finally:
        processor.close(timeout=60)
        worker.join(60)
    offset, last = committed_note(bootstrap, name, source)
    assert offset == 2 and last is not None and last.state == "stopped"




class RaisesAndFailsToClose(Upper):
    """Raises in process() and again in close()."""

    def close(self) -> None:
        raise RuntimeError("close failed too")


def test_a_failing_close_neither_hides_the_error_nor_leaves_clients_open(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """process() raises, then the processor's close() raises as well: the caller still
    gets the ProcessingError, the close failure is logged, nothing is committed, and
    the processor is closed (a new run_loop is refused)."""
    source, output = new_topic("in"), new_topic("out")
    name = unique_name("close-fails")
    kafka.produce(source, [b"ok", b"poison"])
    processor = TopicProcessor(config(bootstrap, name, [source]),
                               lambda c: RaisesAndFailsToClose(c, output, fail_on=b"poison"))
    with structlog.testing.capture_logs() as logs, pytest.raises(ProcessingError):
        processor.run_loop(until_caught_up=True)
    assert [e["event"] for e in logs if e["log_level"] == "error"][-1] == "kasper.close_failed"
    assert logs[-1]["event"] == "kasper.closed"
    assert kafka.committed(name, source) == {0: None}
    with pytest.raises(KasperError, match="is closed"):
        processor.run_loop()


def test_transactional_input_is_committed_past_its_markers(
        bootstrap, new_topic, kafka, unique_name) -> None:
    """Input written in a committed transaction ends with a marker no consumer is
    given. The loop processes every record once and commits past the marker, so the
    committed offset equals the high watermark (lag 0) and a restart processes nothing."""
    source, output = new_topic("in"), new_topic("out")
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": unique_name("txn")})
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(source, b"m%d" % i, partition=0)
    producer.commit_transaction(60)
    name = unique_name("txn-in")
    run(config(bootstrap, name, [source]), output)
    assert [m.value() for m in kafka.read_all(output)] == [b"M%d" % i for i in range(5)]
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": name})
    try:
        high = reader.get_watermark_offsets(TopicPartition(source, 0), timeout=30)[1]
    finally:
        reader.close()
    assert high == 6  # five records and the commit marker
    assert kafka.committed(name, source) == {0: high}
    run(config(bootstrap, name, [source]), output)
    assert len(kafka.read_all(output)) == 5
