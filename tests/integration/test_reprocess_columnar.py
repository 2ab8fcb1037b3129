"""Spark's columnar path beyond one topic of JSON bytes, on a real broker and a local[2]
session: an ``ArrowMessageProcessor`` of two co-partitioned topics with the ``json``
serde sends on Spark what it sends on the live loop; a raising ``process_table`` fails
the job naming partition, offsets and cause, with nothing written and nothing committed;
one reading bytes sends JSON through an output topic's own serde on both runners."""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from typing import Any

import pytest
import reprocess_processors as procs

from kasper_py import Config, OutputTopic, ReprocessError, TopicProcessor
from kasper_py.reprocess import reprocess

pytest_plugins = ["conftest_spark"]
pytestmark = [pytest.mark.integration, pytest.mark.spark]


def two_topics(bootstrap: str, name: str, topics: list[str]) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=topics, batch_size=40,
                  batch_wait=0.2, max_latency=None, key_serde="str", value_serde="json")


def events(kafka: Any, topic: str, amounts: list[int]) -> None:
    kafka.produce(topic, [(b"u%d" % (n % 3), json.dumps({"user": f"u{n % 3}", "amount": a})
                           .encode()) for n, a in enumerate(amounts)])


def outputs(kafka: Any, topic: str) -> Counter[tuple[Any, ...]]:
    return Counter((m.partition(), m.key(), m.value()) for m in kafka.read_all(topic))


def run_live(cfg: Config, output: str) -> None:
    processor = TopicProcessor(cfg, partial(procs.ArrowTopicsDoubler, output=output))
    try:
        processor.run_loop(until_caught_up=True)
    finally:
        processor.close()


def test_json_events_of_two_topics_reprocess_like_the_live_loop(
        bootstrap, new_topic, kafka, unique_name, spark) -> None:
    """Two input topics, the json serde: every event's output (its topic, offset and
    doubled amount, as send_table encodes it) is the same from Spark as from the loop,
    and each topic's range is its own."""
    clicks, views = new_topic("clicks"), new_topic("views")
    live_out, spark_out = new_topic("lo"), new_topic("so")
    events(kafka, clicks, list(range(60)))
    events(kafka, views, list(range(100, 130)))
    cfg = two_topics(bootstrap, unique_name("cols2"), [clicks, views])
    run_live(cfg, live_out)
    result = reprocess(cfg, partial(procs.ArrowTopicsDoubler, output=spark_out), spark=spark)
    assert outputs(kafka, spark_out) == outputs(kafka, live_out)
    sent = sorted((row["topic"], row["offset"], row["doubled"]) for row in (
        json.loads(m.value()) for m in kafka.read_all(spark_out)))
    assert sent == sorted([(clicks, n, 2 * n) for n in range(60)]
                          + [(views, n, 2 * (100 + n)) for n in range(30)])
    [stats] = result.partitions
    assert stats.ranges == {clicks: [0, 59], views: [0, 29]}


def test_a_raising_process_table_of_two_topics_fails_the_job_and_writes_nothing(
        bootstrap, new_topic, kafka, unique_name, spark) -> None:
    """A negative amount in the second topic: ReprocessError naming the partition, both
    topics' offsets and the cause; nothing reaches the output topic and the group's
    offsets stay uncommitted after the handoff was asked for."""
    clicks, views, output = new_topic("clicks"), new_topic("views"), new_topic("out")
    events(kafka, clicks, [1, 2, 3])
    events(kafka, views, [4, -5])
    cfg = two_topics(bootstrap, unique_name("colsfail"), [clicks, views])
    with pytest.raises(ReprocessError) as info:
        reprocess(cfg, partial(procs.ArrowTopicsDoubler, output=output), handoff=True,
                  spark=spark)
    text = str(info.value)
    assert "process() of partition 0 raised ValueError: negative amount" in text
    assert f"{clicks}[0] offsets 0..2" in text and f"{views}[0] offsets 0..1" in text
    assert kafka.read_all(output) == []
    assert kafka.committed(cfg.group, clicks) == {0: None}
    assert kafka.committed(cfg.group, views) == {0: None}


def test_bytes_in_json_out_through_an_output_topics_serde_on_both_runners(
        bootstrap, new_topic, kafka, unique_name, spark) -> None:
    """Events read as bytes (Arrow parses them), output topics declared with the json
    serde: the loop and Spark send send_table's rows as the json serde's bytes, the same
    from both."""
    source, live_out, spark_out = new_topic("in"), new_topic("lo"), new_topic("so")
    events(kafka, source, list(range(30)))
    cfg = Config(name=unique_name("bytes-json"), bootstrap_servers=bootstrap,
                 input_topics=[source], batch_size=40, batch_wait=0.2, max_latency=None,
                 key_serde="str", value_serde="bytes",
                 output_topics=[OutputTopic(live_out, value_serde="json"),
                                OutputTopic(spark_out, value_serde="json")])
    run_live(cfg, live_out)
    reprocess(cfg, partial(procs.ArrowTopicsDoubler, output=spark_out), spark=spark)
    assert outputs(kafka, spark_out) == outputs(kafka, live_out)
    assert sorted(m.value() for m in kafka.read_all(spark_out)) == sorted(
        json.dumps({"topic": source, "offset": n, "doubled": 2 * n}, separators=(",", ":"))
        .encode() for n in range(30))
