"""Metrics, health and the batch log line of a real TopicProcessor run against the
stack's Kafka, in process, with the example processor of examples_module.py."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from examples_module import factory, stores

from kasper_py import Config, TopicProcessor
from kasper_py.observability.metrics import PrometheusObserver
from tests.http_get import get

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = pytest.mark.integration

N = 40


@pytest.fixture
def topics(new_topic: Callable[..., str], kafka: Any,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(input, output) topics of two partitions; the input holds N keyed messages."""
    source, sink = new_topic("met-in", partitions=2), new_topic("met-out", partitions=2)
    monkeypatch.setenv("EXAMPLE_OUTPUT_TOPIC", sink)
    kafka.produce(source, [(f"key-{i % 5}".encode(), f"v{i}".encode()) for i in range(N)])
    yield source, sink


def make_config(bootstrap: str, name: str, source: str) -> Config:
    """A small-batch config, so a run takes several turns."""
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  batch_size=8, batch_wait=0.5)


def sample(observer: PrometheusObserver, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` matching ``labels``."""
    total = 0.0
    for metric in observer.registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_metric_values_and_log_lines_after_a_known_run(
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str]) -> None:
    """After consuming N messages to the end: consumed and produced counters equal N,
    lag is 0 on every partition, every step was timed once per turn, the store was
    measured; and each turn logged one kasper.batch line per partition with processor,
    partition, offsets, counts and step durations."""
    source, _ = topics
    name = unique_name("met-run")
    config = make_config(bootstrap, name, source)
    observer = PrometheusObserver(config)
    with structlog.testing.capture_logs() as logs:
        TopicProcessor(config, factory, stores=stores(config), observer=observer).run_loop(
            until_caught_up=True)
    observer.close()

    assert sample(observer, "kasper_messages_consumed_total", processor=name) == N
    assert sample(observer, "kasper_messages_produced_total", processor=name) == N
    turns = sample(observer, "kasper_turns_total", processor=name)
    assert turns >= N / config.batch_size
    for step in ("process", "flush", "produce", "read_ahead", "commit"):
        assert sample(observer, "kasper_step_duration_seconds_count", step=step) == turns
    for partition in ("0", "1"):
        labels = {"processor": name, "topic": source, "partition": partition}
        assert sample(observer, "kasper_consumer_lag_messages", **labels) == 0
        assert sample(observer, "kasper_oldest_unprocessed_age_seconds", **labels) == 0
    assert sample(observer, "kasper_store_round_trips_total", store="counts") == 2 * turns

    batches = [e for e in logs if e["event"] == "kasper.batch"]
    assert sum(e["consumed"] for e in batches) == N
    for event in batches:
        assert event["processor"] == name and event["topic"] == source
        assert event["partition"] in (0, 1) and event["log_level"] == "info"
        assert event["last_offset"] - event["first_offset"] + 1 == event["consumed"]
        assert {"process_ms", "flush_ms", "produce_ms", "commit_ms", "turn_produced"} <= set(event)
    committed = kafka.committed(name, source, partitions=2)
    last = {e["partition"]: e["last_offset"] for e in batches}
    assert committed == {p: last[p] + 1 for p in last}


def test_two_processors_of_one_name_keep_their_store_metrics_apart(
        bootstrap: str, topics: tuple[str, str], unique_name: Callable[[str], str]) -> None:
    """Two TopicProcessors of one name in one process, one per partition, each with its
    own observer: each observer sees only its own stores' operations and restores."""
    source, _ = topics
    name = unique_name("met-twins")
    observers = []
    for partition in (0, 1):
        config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                        input_partitions=[partition], batch_size=8, batch_wait=0.5)
        observers.append(PrometheusObserver(config))
        TopicProcessor(config, factory, stores=stores(config),
                       observer=observers[-1]).run_loop(until_caught_up=True)
    for partition, observer in enumerate(observers):
        restored = {"processor": name, "store": "counts"}
        assert sample(observer, "kasper_restore_progress_ratio", partition=str(partition),
                      **restored) == 1
        assert sample(observer, "kasper_restore_progress_ratio", partition=str(1 - partition),
                      **restored) == 0
        turns = sample(observer, "kasper_turns_total", processor=name)
        assert sample(observer, "kasper_store_round_trips_total", store="counts") == 2 * turns
        observer.close()




def test_exporter_and_health_of_a_running_processor(
        bootstrap: str, topics: tuple[str, str], unique_name: Callable[[str], str]) -> None:
    """While the loop runs, /health/ready and /health/live answer 200 and /metrics shows
    the consumed count reaching N; after close() both health checks answer 503."""
    source, _ = topics
    name = unique_name("met-http")
    config = make_config(bootstrap, name, source)
    observer = PrometheusObserver(config)
    base = f"http://127.0.0.1:{observer.serve(0, '127.0.0.1').port}"
    processor = TopicProcessor(config, factory, stores=stores(config), observer=observer)
    loop = threading.Thread(target=processor.run_loop, daemon=True)
    loop.start()
    try:
        wait_for(lambda: get(f"{base}/health/ready")[0] == 200, "readiness")
        assert json.loads(get(f"{base}/health/live")[1])["status"] == "ok"
        consumed = f'kasper_messages_consumed_total{{partition="0",processor="{name}"'
        wait_for(lambda: _scraped_total(get(f"{base}/metrics")[1], name) == N,
                 "the scraped consumed counter to reach N")
        assert consumed in get(f"{base}/metrics")[1]
    finally:
        processor.close(timeout=30)
        loop.join(30)
    assert get(f"{base}/health/ready")[0] == 503
    assert get(f"{base}/health/live")[0] == 503
    observer.close()


def _scraped_total(text: str, name: str) -> float:
    """Sum of kasper_messages_consumed_total lines of processor ``name``."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kasper_messages_consumed_total{")
               and f'processor="{name}"' in line)


def test_lag_of_a_partition_with_nothing_committed_is_reported(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Input only on partition 0: partition 1 never gets a commit, yet its lag gauge
    shows 0 rather than no data; partition 0's shows 0 once it is consumed."""
    source, sink = new_topic("lag-in", partitions=2), new_topic("lag-out", partitions=2)
    monkeypatch.setenv("EXAMPLE_OUTPUT_TOPIC", sink)
    kafka.produce(source, [(b"k", b"v%d" % i) for i in range(10)], partition=0)
    name = unique_name("met-lag")
    config = make_config(bootstrap, name, source)
    observer = PrometheusObserver(config)
    TopicProcessor(config, factory, stores=stores(config), observer=observer).run_loop(
        until_caught_up=True)
    observer.close()
    assert kafka.committed(name, source, 2) == {0: 10, 1: None}
    for partition in ("0", "1"):
        assert observer.registry.get_sample_value("kasper_consumer_lag_messages", {
            "processor": name, "topic": source, "partition": partition}) == 0.0
