"""Kafka Streams' WordCountDemo in the streams DSL: lines split into lowercase words,
grouped by word (through a repartition), counted in a RocksDB table, every new count
sent to `streams-wordcount-output`.

The Java original (org.apache.kafka.streams.examples.wordcount.WordCountDemo):

    source.flatMapValues(value -> Arrays.asList(value.toLowerCase().split("\\\\W+")))
          .groupBy((key, value) -> value)
          .count(Materialized.as("counts-store"))
          .toStream()
          .to("streams-wordcount-output", Produced.with(Serdes.String(), Serdes.Long()));

As Kafka Streams does with its record cache, each batch's words are counted per word
before the repartition, and each word's count is sent once per batch with its latest
value: "all streams lead to kafka" and "hello kafka streams" read in one batch give
`kafka` 2 and `streams` 2. ``word_count(cache=False)`` updates the counts word by word
(Kafka Streams with record caching disabled): `kafka` 1, then 2. Counts are sent as
text (`"2"`), the word as the key; the table `counts-store` is served over HTTP with
`--query-port`.

Delivery: at-least-once (a crash may send a count twice; the table stays exact), or
exactly-once with `--exactly-once` (`KASPER_PROCESSING_GUARANTEE=exactly_once` with
`kasper run`).

    python examples/streams_word_count.py --sample --until-caught-up
    KASPER_KEY_SERDE=str KASPER_VALUE_SERDE=str kasper run streams_word_count:app \\
        --app-dir examples --bootstrap-servers 127.0.0.1:19092 --query-port 9500
"""

from __future__ import annotations

import argparse
import re
import sys

from confluent_kafka import Producer

from kasper_py import Config, OutputTopic, TopicProcessor
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.kafka.admin import ensure_output_topics

from _sample import create_topics  # isort: skip - the examples' shared sample helper

INPUT, OUTPUT = "streams-plaintext-input", "streams-wordcount-output"
SAMPLE = ["all streams lead to kafka", "hello kafka streams", "join kafka summit"]
"""The lines of Kafka Streams' quickstart."""
_NON_WORD = re.compile(r"\W+")


def words(line: str | None) -> list[str]:
    """The line's lowercase words (Java's ``split("\\\\W+")`` without empty strings)."""
    return [w for w in _NON_WORD.split((line or "").lower()) if w]


def word_count(input_topic: str = INPUT, output_topic: str = OUTPUT, *,
               name: str = "streams-wordcount", cache: bool = True) -> App:
    """The word count as an ``App``: two stages joined by the repartition
    ``counts-store-by-key``; run it with str keys and values. ``cache=False``: one
    count update per word read."""
    builder = Builder(name, cache=cache)
    (builder.stream(input_topic)
        .flat_map_values(words)
        .group_by(lambda _key, word: word)
        .count("counts-store")
        .to_stream()
        .map_values(str)
        .to(output_topic))
    return builder.build()


app = word_count()
"""The app on Kafka Streams' topic names, for ``kasper run streams_word_count:app``."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--name", default="streams-wordcount")
    parser.add_argument("--input", default=INPUT)
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--state-dir", default="kasper-state")
    parser.add_argument("--query-port", type=int, default=None)
    parser.add_argument("--sample", action="store_true",
                        help="create the topics and write the quickstart's three lines")
    parser.add_argument("--exactly-once", action="store_true")
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    if args.sample:
        _produce_sample(args.bootstrap, args.input)
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.input],
                    key_serde="str", value_serde="str", state_dir=args.state_dir,
                    query_port=args.query_port, batch_wait=0.2,
                    processing_guarantee="exactly_once" if args.exactly_once
                    else "at_least_once", output_topics=[OutputTopic(args.output)])
    ensure_output_topics(config)  # created when absent, as `kasper run --create-topics` does
    with TopicProcessor(config, word_count(args.input, args.output, name=args.name)) as loop:
        # SIGTERM or Ctrl-C: the batch in hand is committed, then the loop closes
        loop.run_until_stopped(until_caught_up=args.until_caught_up)
    return 0


def _produce_sample(bootstrap: str, topic: str) -> None:
    create_topics(bootstrap, [topic], 1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for line in SAMPLE:
        producer.produce(topic, line.encode())
    producer.flush(30)


if __name__ == "__main__":
    sys.exit(main())
