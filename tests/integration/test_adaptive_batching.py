"""``Config.max_latency`` on the real broker: the loop sizing its own batches copies
every message once and commits exactly to the end, static and in group mode; with the
defaults a backlog gets batches past Kasper's 1,000, and large records batches bounded
in bytes; a processor that raises leaves its failing batch uncommitted."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from kasper_py import Config, ProcessingError, TopicProcessor
from kasper_py.observability.observe import NoopObserver, TurnStats

sys.path.insert(0, str(Path(__file__).parent))
from test_topic_processor import Upper, config, run  # isort: skip

pytestmark = pytest.mark.integration
PARTITIONS = 3


class Targets(NoopObserver):
    """Every turn's batch length and batch size target."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.targets: list[int | None] = []
        self.bytes: list[int] = []

    def on_turn(self, stats: TurnStats) -> None:
        self.lengths.append(len(stats.batch))
        self.targets.append(stats.batch_size_target)
        self.bytes.append(sum(len(m.value) for messages in stats.batch.by_partition.values()
                              for m in messages))


def run_observed(cfg: Config, output: str) -> Targets:
    """Run an ``Upper`` loop until caught up; what each of its turns took."""
    observer = Targets()
    processor = TopicProcessor(cfg, lambda c: Upper(c, output), observer=observer)
    try:
        processor.run_loop(until_caught_up=True)
    finally:
        processor.close()
    return observer


def produce_input(kafka, source: str, per_partition: int) -> dict[int, list[bytes]]:
    sent = {p: [b"p%d-m%d" % (p, i) for i in range(per_partition)] for p in range(PARTITIONS)}
    for p, values in sent.items():
        kafka.produce(source, values, partition=p)
    return sent


@pytest.mark.parametrize("assignment", ["static", "group"])
def test_max_latency_loop_outputs_everything_once_and_commits_the_end(
        bootstrap, new_topic, kafka, unique_name, assignment) -> None:
    """A backlog of 6,000 messages through a loop with max_latency: every output once,
    in order per partition, every partition committed at its end; batches start at the
    controller's smallest (100) and grow through the backlog, their target reported each
    turn within 1..batch_size."""
    source = new_topic("in", partitions=PARTITIONS)
    output = new_topic("out", partitions=PARTITIONS)
    sent = produce_input(kafka, source, 2_000)
    name = unique_name("adaptive")
    cfg: Config = config(bootstrap, name, [source], max_latency=0.05, batch_size=1_000,
                         assignment=assignment)
    observer = run_observed(cfg, output)
    received = kafka.read_all(output)
    assert Counter((m.partition(), m.value()) for m in received) == Counter(
        (p, v.upper()) for p, values in sent.items() for v in values)
    for p in range(PARTITIONS):
        assert [m.value() for m in received if m.partition() == p] == [
            v.upper() for v in sent[p]]
    assert kafka.committed(name, source, PARTITIONS) == dict.fromkeys(range(PARTITIONS), 2_000)
    assert observer.lengths[0] <= 100 < max(observer.lengths)
    assert all(t is not None and 1 <= t <= 1_000 for t in observer.targets)


def test_max_latency_failing_batch_stays_uncommitted(bootstrap, new_topic, kafka,
                                                      unique_name) -> None:
    """process() raising mid-run with max_latency: the loop stops with ProcessingError
    and the committed offset is exactly where the failing batch starts; a fixed
    processor then takes it and reaches the end."""
    source, output = new_topic("in"), new_topic("out")
    values = [b"m%d" % i for i in range(3_000)]
    values[2_345] = b"poison"
    kafka.produce(source, values)
    name = unique_name("adaptive-fails")
    cfg: Config = config(bootstrap, name, [source], max_latency=0.05, batch_size=500)
    with pytest.raises(ProcessingError) as info:
        run(cfg, output, fail_on=b"poison")
    found = re.search(rf"{re.escape(source)}\[0\] offsets (\d+)\.\.(\d+)", str(info.value))
    assert found, str(info.value)
    first, last = int(found[1]), int(found[2])
    assert first <= 2_345 <= last
    assert kafka.committed(name, source) == {0: first}
    run(cfg, output)
    assert kafka.committed(name, source) == {0: 3_000}
    # the failing batch produced nothing: every output once, in order
    assert [m.value() for m in kafka.read_all(output)] == [v.upper() for v in values]


def test_defaults_grow_a_backlogs_batches_past_kaspers_1000(bootstrap, new_topic, kafka,
                                                            unique_name) -> None:
    """A backlog of 30,000 messages through a loop with every batching default
    (``batch_size=None``, the 50 ms target): every output once, each partition committed
    at its end, and batches past the 1,000 of Kasper's classic default, within 20,000."""
    source = new_topic("in", partitions=PARTITIONS)
    output = new_topic("out", partitions=PARTITIONS)
    sent = produce_input(kafka, source, 10_000)
    name = unique_name("adaptive-defaults")
    cfg: Config = config(bootstrap, name, [source], batch_size=None, batch_wait=1.0)
    observer = run_observed(cfg, output)
    assert Counter(m.value() for m in kafka.read_all(output)) == Counter(
        v.upper() for values in sent.values() for v in values)
    assert kafka.committed(name, source, PARTITIONS) == dict.fromkeys(range(PARTITIONS), 10_000)
    assert 1_000 < max(observer.lengths) <= 20_000


def test_large_records_make_batches_bounded_in_bytes(bootstrap, new_topic, kafka,
                                                     unique_name) -> None:
    """3,000 records of 10 KB with batch_bytes of 1 MiB: no batch holds more than 1 MiB
    of values, every output arrives once and the end is committed."""
    source, output = new_topic("in"), new_topic("out")
    values = [b"%05d" % n + b"x" * 10_235 for n in range(3_000)]
    kafka.produce(source, values)
    name = unique_name("adaptive-bytes")
    cfg: Config = config(bootstrap, name, [source], batch_size=None, batch_bytes=2**20)
    observer = run_observed(cfg, output)
    assert [m.value() for m in kafka.read_all(output)] == [v.upper() for v in values]
    assert kafka.committed(name, source) == {0: 3_000}
    assert max(observer.bytes) <= 2**20
    assert max(observer.lengths) == 2**20 // 10_240
