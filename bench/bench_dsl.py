"""The streams DSL (kasper_py.dsl) against the same work hand-written as processors, in
one run on the same broker, batch 10,000, at-least-once, RocksDB state.

Rows, each in its own child process reading its input from the start:

``ceiling``           consume-only, deep prefetch (bench_passthrough.DEEP): records read
                      and dropped, the broker's ceiling
``passthrough``       a ``MessageProcessor`` sending each record on (benchkit.Passthrough)
``dsl_chain``         ``stream(t).filter(...).map_values(...).to(out)``: the same records
``count_hand``        words keyed by word: a ``MessageProcessor`` counting in a RocksDB
                      table, one ``get_many`` and one ``put_many`` per batch, sending each
                      record's new count (one output a record, as the DSL's count emits)
``dsl_count``         ``stream(t).group_by_key().count(...).to_stream().to(out)``
``count_hand_app``    lines of five words: an ``App`` of two processors, one splitting
                      lines and re-keying the words through a repartition, one counting
                      as ``count_hand`` does
``dsl_count_lines``   ``stream(t).flat_map_values(split).group_by(word).count(...)``: the
                      same repartition

The word counts are compared twice: on input keyed by word (no repartition on either
side: what the operators cost), and on lines re-keyed through a repartition on both
sides (what a user writes). A benchmark, not a test: the targets (DSL count >= 0.8x the
hand-written one, the chain >= 0.9x passthrough) are printed, never asserted.

    python bench/bench_dsl.py --messages 400000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import uuid
from typing import Any

from bench_passthrough import DEEP
from benchkit import (
    Passthrough,
    StopWhenDone,
    arguments,
    child_answered,
    create_topics,
    delete_topics,
    fill,
    run_in_child,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.stores.rocksdb import RocksDBTable

WORDS_PER_LINE = 5
VOCABULARY = [f"w{i}" for i in range(1000)]
ROWS = ("ceiling", "passthrough", "dsl_chain", "count_hand", "dsl_count", "count_hand_app",
        "dsl_count_lines")
ON_LINES = {"count_hand_app", "dsl_count_lines"}


class CountHand(MessageProcessor):
    """Counts per key in ``counts``: one ``get_many`` and one ``put_many`` per batch;
    sends each record's new count."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.counts = context.store("counts")
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.counts.get_many({m.key for m in messages})
        send, output = sender.send, self.output
        for m in messages:
            totals[m.key] = total = totals.get(m.key, 0) + 1
            send(output, total, m.key)
        self.counts.put_many(totals)


class SplitLines(MessageProcessor):
    """Each line's words through the repartition ``words``, keyed by word."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        repartition = sender.repartition
        for m in messages:
            for word in m.value.split():
                repartition("words", word, word)


def hand_app(name: str, source: str, output: str) -> App:
    app = App(name)
    words = app.repartition("words")
    app.processor("split", SplitLines, inputs=[source], outputs=[words])
    app.processor("count", lambda c: CountHand(c, output), inputs=[words], outputs=[output],
                  stores=[_table()])
    return app


def dsl_app(kind: str, name: str, source: str, output: str) -> App:
    builder = Builder(name)
    stream = builder.stream(source)
    if kind == "dsl_chain":
        stream.filter(lambda _k, v: v is not None).map_values(bytes).to(output)
    elif kind == "dsl_count":
        stream.group_by_key().count("counts").to_stream().to(output)
    else:
        (stream.flat_map_values(str.split).group_by(lambda _k, word: word)
            .count("counts").to_stream().to(output))
    return builder.build()


def _table() -> RocksDBTable:
    return RocksDBTable("counts", key_serde="json", value_serde="json")


def target(kind: str, name: str, args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """What the row's ``TopicProcessor`` runs, and its stores."""
    if kind == "passthrough":
        return lambda _c: Passthrough(args.output), []
    if kind == "count_hand":
        return lambda c: CountHand(c, args.output), [_table()]
    if kind == "count_hand_app":
        return hand_app(name, args.source, args.output), []
    return dsl_app(kind, name, args.source, args.output), []


def loop_child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one row to the end of its input; msgs/s and CPU per message."""
    kind, name = args.child, f"bench-dsl-{args.child}-{uuid.uuid4().hex[:8]}"
    counted = args.messages * (WORDS_PER_LINE + 1) if kind in ON_LINES else args.messages
    text = kind.startswith("count") or kind.startswith("dsl_count")
    config = Config(name=name, bootstrap_servers=args.bootstrap, input_topics=[args.source],
                    batch_size=args.batch_size, batch_wait=1.0, state_dir=args.state_dir,
                    key_serde="str" if text else "bytes", value_serde="json" if text else "bytes")
    before, started = _cpu(), time.perf_counter()
    if kind == "ceiling":
        _consume_only(args)
    else:
        runs, stores = target(kind, name, args)
        observer = StopWhenDone(counted)
        processor = TopicProcessor(config, runs, stores=stores, observer=observer)
        observer.processor = processor
        processor.run_loop()
    elapsed, cpu = time.perf_counter() - started, _cpu() - before
    return {"kind": kind, "name": name, "msgs_per_s": args.messages / elapsed,
            "cpu_us": cpu / args.messages * 1e6}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _consume_only(args: argparse.Namespace) -> None:
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "enable.auto.commit": False,
                         "group.id": f"bench-dsl-ceiling-{uuid.uuid4().hex[:8]}", **DEEP})
    meta = consumer.list_topics(args.source, timeout=30).topics[args.source]
    consumer.assign([TopicPartition(args.source, p, OFFSET_BEGINNING) for p in meta.partitions])
    read = 0
    while read < args.messages:
        read += len(consumer.consume(args.batch_size, 1.0))
    consumer.close()


def run_child(kind: str, args: argparse.Namespace, source: str, output: str) -> dict[str, Any]:
    found = run_in_child(__file__, kind, args, source, output)
    _delete_internal(args.bootstrap, found["name"])
    return found


def _delete_internal(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient

    topics = [t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=30).topics if t.startswith(name + "-")]
    if topics:
        delete_topics(bootstrap, topics)


def inputs(messages: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(words keyed by word, valued 1), (lines of five words, JSON strings): ``messages``
    each."""
    words = [VOCABULARY[n * 7919 % len(VOCABULARY)] for n in range(messages * WORDS_PER_LINE)]
    keyed = [{"key": w.encode(), "value": b"1"} for w in words[:messages]]
    lines = [{"value": json.dumps(" ".join(words[n:n + WORDS_PER_LINE])).encode()}
             for n in range(0, len(words), WORDS_PER_LINE)]
    return keyed, lines


def report(best: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nbest of {args.rounds} rounds, {args.messages:,} input records, "
          f"batch {args.batch_size:,}, {args.partitions} partitions:")
    for kind in ROWS:
        row = best[kind]
        print(f"  {kind:16} {row['msgs_per_s']:>10,.0f} msgs/s {row['cpu_us']:>7.2f} us CPU/msg")
    def ratio(dsl: str, hand: str) -> float:
        return float(best[dsl]["msgs_per_s"] / best[hand]["msgs_per_s"])

    print(f"dsl_chain / passthrough:          {ratio('dsl_chain', 'passthrough'):.2f} "
          "(target >= 0.9)")
    print(f"dsl_count / count_hand:           {ratio('dsl_count', 'count_hand'):.2f} "
          "(target >= 0.8; keyed input, no repartition)")
    print(f"dsl_count_lines / count_hand_app: {ratio('dsl_count_lines', 'count_hand_app'):.2f} "
          "(target >= 0.8; lines, a repartition on both sides)")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=400_000, partitions=2)
    parser.add_argument("--child", choices=ROWS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if child_answered(args, loop_child):
        return
    run = uuid.uuid4().hex[:8]
    words, lines, output = (f"bench-dsl-{what}-{run}" for what in ("words", "lines", "out"))
    create_topics(args.bootstrap, [words, lines, output], args.partitions)
    keyed, text = inputs(args.messages)
    fill(args.bootstrap, words, args.partitions, keyed)
    fill(args.bootstrap, lines, args.partitions, text)
    best: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(args.rounds):  # alternate, so compared rows see the same machine
            for kind in ROWS:
                r = run_child(kind, args, lines if kind in ON_LINES else words, output)
                if r["msgs_per_s"] > best.get(kind, {}).get("msgs_per_s", 0.0):
                    best[kind] = r
                print(f"  {kind:16} {r['msgs_per_s']:>10,.0f} msgs/s "
                      f"{r['cpu_us']:>7.2f} us CPU/msg", flush=True)
        report(best, args)
    finally:
        delete_topics(args.bootstrap, [words, lines, output])


if __name__ == "__main__":
    main()
