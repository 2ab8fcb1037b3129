"""Records the DSL's windowed join and windowed aggregation cannot take (a ``None`` key
or value, skipped as Kafka Streams skips them) are counted in
``kasper_messages_skipped_total`` with their reason, through the real loop on the
in-memory broker: never dropped silently."""

from __future__ import annotations

import json
from typing import Any

from kasper_py import Config, TopicProcessor
from kasper_py.dsl import Builder
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.testing import InMemoryBroker
from kasper_py.windows import JoinWindows, Tumbling


def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


def run(builder: Builder, produced: list[tuple[str, bytes | None, bytes | None]]
        ) -> tuple[InMemoryBroker, PrometheusObserver]:
    """``builder``'s app run to the end over ``produced`` (topic, key, value), each a
    millisecond after the last, with a Prometheus observer."""
    app = builder.build()
    broker = InMemoryBroker()
    for topic in (*app.sources, "out"):
        broker.create_topic(topic)
    for at, (topic, key, value) in enumerate(produced, start=100):
        broker.produce(topic, value, key, timestamp=at)
    config = Config(name="skips", bootstrap_servers="memory", input_topics=app.sources,
                    key_serde="json", value_serde="json")
    observer = PrometheusObserver(config)
    processor = TopicProcessor(config, app, clients=broker.clients(config), observer=observer)
    processor.run_loop(until_caught_up=True)
    processor.close()
    return broker, observer


def skipped(observer: PrometheusObserver, reason: str) -> float | None:
    return observer.registry.get_sample_value("kasper_messages_skipped_total", {
        "processor": "skips", "topic": "", "partition": "0", "policy": "skip",
        "reason": reason})


def test_a_windowed_join_counts_the_records_with_no_key_or_no_value_it_skips() -> None:
    """Of an inner join's inputs, two keyless records and one with a ``null`` value are
    skipped and counted by reason; the others join as before."""
    b = Builder("skips", stores="memory")
    b.stream("l").join(b.stream("r"), pair, JoinWindows(1), store="pairs").to("out")
    broker, observer = run(b, [("l", b'"k"', b'"L"'), ("l", None, b'"L-keyless"'),
                               ("r", None, b'"R-keyless"'), ("r", b'"k"', b"null"),
                               ("r", b'"k"', b'"R"')])
    assert [(json.loads(m.key or b""), json.loads(m.value or b""))
            for m in broker.read("out")] == [("k", ["L", "R"])]
    assert skipped(observer, "null_key") == 2
    assert skipped(observer, "null_value") == 1


def test_a_windowed_count_counts_the_records_with_no_key_or_no_value_it_skips() -> None:
    """A windowed count skips (and counts) a keyless record and a ``null`` value; the
    others are counted in their window."""
    b = Builder("skips", stores="memory")
    (b.stream("l").group_by_key().windowed_by(Tumbling(1)).count("counts")
        .to_stream().to("out"))
    broker, observer = run(b, [("l", b'"a"', b'"x"'), ("l", None, b'"x"'),
                               ("l", b'"a"', b"null"), ("l", b'"a"', b'"y"')])
    assert json.loads(broker.read("out")[-1].value or b"") == 2
    assert skipped(observer, "null_key") == 1
    assert skipped(observer, "null_value") == 1
