"""One turn, three runners: the testing driver, the live loop and the Spark task give
the same outputs, dead letters and effectively-once store state for the same input,
undecodable records included."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis
import reprocess_processors as procs

from kasper_py import Config, Message, TopicProcessor
from kasper_py.stack import redis_url
from kasper_py.testing import ProcessorDriver

pytestmark = pytest.mark.integration

PARTITIONS = 2
BATCH = 7
BAD = {(0, 5), (1, 11), (1, 12)}  # (partition, index) of records that are not JSON
RUNNER_HEADERS = ("kasper.processor", "kasper.source.timestamp")
"""Dead-letter headers that differ by runner: its name, and the broker's append time
(the driver's input has none)."""


def records() -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of the input: words as JSON, a few undecodable values."""
    rows = []
    for partition in range(PARTITIONS):
        for index in range(40):
            word = f"w{(index * 7 + partition) % 5}"
            value = b"{not json" if (partition, index) in BAD else json.dumps(
                {"word": word}).encode()
            rows.append((partition, word.encode(), value))
    return rows


def expected_counts() -> dict[tuple[int, str], int]:
    counts: Counter[tuple[int, str]] = Counter()
    for partition, key, value in records():
        if value != b"{not json":
            counts[partition, key.decode()] += 1
    return dict(counts)


def config(bootstrap: str, name: str, source: str, dead: str) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  key_serde="str", value_serde="json", batch_size=BATCH, batch_wait=0.2,
                  on_decode_error="dead_letter", dead_letter_topic=dead)


def run_driver(cfg: Config, output: str, _kafka: Any, _spark: Any) -> list[tuple[Any, ...]]:
    driver = ProcessorDriver(partial(procs.JsonCount, output=output), config=cfg,
                             stores=procs.exact_count_stores(cfg))
    by_partition: dict[int, list[Message]] = {}
    for partition, key, value in records():
        offset = len(by_partition.setdefault(partition, []))
        by_partition[partition].append(Message(cfg.input_topics[0], partition, offset, key,
                                               value, None, ()))
    for partition, messages in by_partition.items():
        for start in range(0, len(messages), BATCH):
            driver.process(messages[start:start + BATCH], encoded=True)
        assert driver.committed[cfg.input_topics[0], partition] == len(messages)
    return [(m.topic, m.key, m.value, tuple(m.headers or ())) for m in driver.sent]


def run_loop(cfg: Config, output: str, kafka: Any, _spark: Any) -> list[tuple[Any, ...]]:
    processor = TopicProcessor(cfg, partial(procs.JsonCount, output=output),
                               stores=procs.exact_count_stores(cfg))
    with processor:
        processor.run_loop(until_caught_up=True)
    return read_outputs(kafka, cfg, output)


def run_spark(cfg: Config, output: str, kafka: Any, spark: Any) -> list[tuple[Any, ...]]:
    from kasper_py.reprocess import reprocess

    reprocess(cfg, partial(procs.JsonCount, output=output),
              stores=procs.exact_count_stores(cfg), spark=spark())
    return read_outputs(kafka, cfg, output)


def read_outputs(kafka: Any, cfg: Config, output: str) -> list[tuple[Any, ...]]:
    assert cfg.dead_letter_topic is not None
    return [(topic, m.key(), m.value(), tuple(m.headers() or ()))
            for topic in (output, cfg.dead_letter_topic) for m in kafka.read_all(topic)]


RUNNERS: dict[str, Callable[..., list[tuple[Any, ...]]]] = {
    "driver": run_driver, "loop": run_loop, "spark": run_spark}


@pytest.fixture(scope="module")
def spark_once() -> Iterator[Callable[[], Any]]:
    """A local Spark session, started only if the Spark runner asks for it."""
    sessions: list[Any] = []

    def get() -> Any:
        if not sessions:
            from kasper_py.reprocess import spark_session

            session = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
            session.sparkContext.addPyFile(procs.__file__)
            sessions.append(session)
        return sessions[0]

    yield get
    for session in sessions:
        session.stop()


def comparable(outputs: list[tuple[Any, ...]], source: str, output: str,
               dead: str) -> Counter[tuple[Any, ...]]:
    """Outputs with the runner-specific topic names replaced, and RUNNER_HEADERS left out."""
    names = {output: "OUT", dead: "DEAD"}
    return Counter((names[topic], key, value,
                    tuple((k, v.replace(source.encode(), b"SRC") if v else v) for k, v in headers
                          if k not in RUNNER_HEADERS))
                   for topic, key, value, headers in outputs)


def store_state(name: str) -> dict[tuple[int, str], int]:
    client = redis.Redis.from_url(redis_url())
    state = {}
    for key in client.scan_iter(match=f"{name}/{procs.STORE}/*", count=1000):
        _, _, partition, word = key.decode().split("/", 3)
        state[int(partition), word] = json.loads(client.get(key))
    return state


REFERENCE: dict[str, Any] = {}
"""Filled by the first runner; every runner must match it."""


@pytest.mark.parametrize("runner", [
    "driver", "loop", pytest.param("spark", marks=pytest.mark.spark)])
def test_same_outputs_dead_letters_and_state_on_every_runner(
        runner: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], spark_once: Callable[[], Any]) -> None:
    """Each runner, on the same input: the exact per-partition counts in the
    effectively-once store, one output per decodable record with its running count,
    one dead letter (original bytes, error headers) per undecodable record."""
    source = new_topic("par-in", partitions=PARTITIONS)
    output, dead = new_topic("par-out", partitions=PARTITIONS), new_topic("par-dead")
    for partition, key, value in records():
        kafka.produce(source, [(key, value)], partition=partition)
    name = unique_name(f"par-{runner}")
    cfg = config(kafka.bootstrap, name, source, dead)
    outputs = RUNNERS[runner](cfg, output, kafka, spark_once)
    assert store_state(name) == expected_counts()
    seen = comparable(outputs, source, output, dead)
    assert sum(n for (kind, *_), n in seen.items() if kind == "DEAD") == len(BAD)
    assert sum(n for (kind, *_), n in seen.items() if kind == "OUT") == 80 - len(BAD)
    REFERENCE.setdefault("outputs", seen)
    assert seen == REFERENCE["outputs"]
