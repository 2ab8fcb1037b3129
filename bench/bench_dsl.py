"""The streams DSL (kasper_py.dsl) against the same work hand-written as processors, in
one run on the same broker, at-least-once, RocksDB state.

Rows, each in its own child process reading its input from the start. On --messages
records keyed by word (valued ``1``), batch --batch-size, the latency target default:

``ceiling``          consume-only, deep prefetch (bench_passthrough.DEEP): the broker's
                     ceiling
``passthrough``      a ``MessageProcessor`` sending each record on (benchkit.Passthrough)
``dsl_chain``        ``stream(t).filter(...).map_values(...).to(out)``: the same records
``chain_hand``       a ``MessageProcessor`` calling the chain's two functions per record
                     and sending each record with its timestamp: the DSL's own cost is
                     ``dsl_chain`` against this row, the functions' is this row against
                     ``passthrough``
``count_hand``       a ``MessageProcessor`` counting per key in a RocksDB table, one
                     ``get_many`` and one ``put_many`` per batch, each key's new count
                     sent once per batch
``dsl_count``        ``stream(t).group_by_key().count(...).to_stream().to(out)``

The word count of the issue on --lines lines of five words (vocabulary 10,000), JSON
strings, ``-best`` rows tuned (batch 10,000, ``max_latency=None``, batch_wait 0.1 s:
the last partial batch of a repartition does not wait a second), ``-default`` rows
with ``Config``'s defaults:

``wc_hand``          one stage: split, count per word in a RocksDB table (partition-
                     local: no re-key), each word's new count sent once per batch
``wc_dsl``           Kafka Streams' shape: ``flat_map_values(split).group_by(word)
                     .count(...).to_stream().to(out)``: a repartition, combined per
                     word and batch, packed (the default with the ``str`` key serde:
                     one Kafka record per partition and turn); each word's count sent
                     once per batch
``wc_dsl_uncached``  (``--rows``) the same with ``Builder(cache=False)``: every word
                     through the repartition, one update per word
``wc_dsl_plain``,    (``--rows``) ``wc_dsl`` and ``wc_dsl_uncached`` with
``wc_dsl_uncached_plain`` ``Builder(pack_repartitions=False)``: a Kafka record per
                     record through the repartition, against the default's packed
                     records (docs/streams-dsl.md)
``wc_dsl_latest``,   (``--rows``) ``wc_dsl`` and ``dsl_count`` with
``dsl_count_latest`` ``Builder(timestamps="latest")``: Kafka Streams' stamps, each
                     count's times kept in a second store (docs/streams-dsl.md)

(``--rows`` also takes ``-wide`` word counts: batches up to 10,000 with the latency
target on, what a backlog's batches may be with defaults that grow with it.)

Each row prints records/s (words/s for word counts: wall time from the loop's start to
the commit of the last record, its repartition's included), CPU per record (all threads,
and the loop thread alone), the records it sent to the output and to its repartitions,
the load average as it ended, and in the summary its ratio to its baseline
(``BASELINE``); the compared pairs print the ratio of their best rounds and of each
round (the row order turns round by one from round to round). ``--before DIR`` runs every row on
the kasper_py in DIR too, right after it in each round (an A/B on one machine). A
benchmark, not a test: the targets (the chain >= 0.95x passthrough, the DSL word count
with defaults >= 0.5x the hand-written one at its best) are printed, never asserted.

    python bench/bench_dsl.py --messages 400000 --lines 200000 --rounds 2
    git archive HEAD~1 kasper_py | tar -x -C /tmp/before
    python bench/bench_dsl.py --rows passthrough,dsl_chain --rounds 4 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time
import uuid
from collections import Counter
from typing import Any

from bench_passthrough import DEEP
from benchkit import (
    Passthrough,
    arguments,
    child_answered,
    create_topics,
    delete_topics,
    fill,
    run_in_child,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.stores.rocksdb import RocksDBTable

WORDS_PER_LINE = 5
VOCABULARY = [f"w{i}" for i in range(10_000)]
KEYED = ("ceiling", "passthrough", "dsl_chain", "chain_hand", "count_hand", "dsl_count")
ROWS = (*KEYED, "wc_hand-best", "wc_hand-default", "wc_dsl-default", "wc_dsl-best")
OPTIONAL = ("wc_dsl_uncached-best", "wc_dsl_uncached-default", "wc_hand-wide", "wc_dsl-wide",
            "dsl_count_latest", "wc_dsl_latest-best", "wc_dsl_plain-best",
            "wc_dsl_plain-default", "wc_dsl_uncached_plain-best",
            "wc_dsl_uncached_plain-default")
KEYED_OPTIONAL = ("dsl_count_latest",)
TUNED = {"batch_size": 10_000, "max_latency": None, "batch_wait": 0.1}


class CountHand(MessageProcessor):
    """Counts per key (or per word of each line, ``lines``) in ``counts``: one
    ``get_many`` and one ``put_many`` per batch; sends each key's new count."""

    def __init__(self, context: ProcessorContext, output: str, *, lines: bool) -> None:
        self.counts = context.store("counts")
        self.output, self.lines = output, lines

    def process(self, messages: list[Message], sender: Sender) -> None:
        keys = [w for m in messages for w in m.value.split()] if self.lines else [
            m.key for m in messages]
        totals = self.counts.get_many(set(keys))
        for key, n in Counter(keys).items():
            totals[key] = totals.get(key, 0) + n
        self.counts.put_many(totals)
        send, output = sender.send, self.output
        for key, total in totals.items():
            send(output, total, key)


def keep(_key: Any, value: Any) -> bool:
    return value is not None


class ChainHand(MessageProcessor):
    """``dsl_chain`` written by hand: ``keep``, then ``bytes``, then sent on."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        send, output = sender.send, self.output
        for m in messages:
            if keep(m.key, m.value):
                send(output, bytes(m.value), m.key, timestamp=m.timestamp)


class StopWhenDrained(NoopObserver):
    """Stops the loop once ``total`` records of ``source`` are processed and every
    record the app sent to its repartitions by then is committed too."""

    def __init__(self, source: str, total: int, bootstrap: str) -> None:
        self.source, self.total, self.bootstrap = source, total, bootstrap
        self.read, self.ends = 0, None
        self.processor: TopicProcessor | None = None

    def on_turn(self, stats: TurnStats) -> None:
        self.read += sum(r.count for (t, _), r in stats.batch.ranges.items() if t == self.source)
        if self.read < self.total or self.processor is None:
            return
        if self.ends is None:  # the turn that read the last line has produced its records
            self.ends = _end_offsets(self.bootstrap, [tp for tp in stats.committed
                                                      if tp[0] != self.source])
        if all(stats.committed.get(tp, 0) >= end for tp, end in self.ends.items()):
            self.processor.close()


def _end_offsets(bootstrap: str, partitions: list[tuple[str, int]]) -> dict[Any, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-dsl-ends"})
    try:
        return {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=30)[1]
                for tp in partitions}
    finally:
        consumer.close()


def dsl_app(kind: str, name: str, source: str, output: str) -> App:
    stamps: dict[str, Any] = {"timestamps": "latest"} if "_latest" in kind else {}
    plain: dict[str, Any] = {"pack_repartitions": False} if "_plain" in kind else {}
    builder = Builder(name, cache="uncached" not in kind, **stamps, **plain)
    stream = builder.stream(source)
    if kind == "dsl_chain":
        stream.filter(keep).map_values(bytes).to(output)
    elif kind.startswith("dsl_count"):
        stream.group_by_key().count("counts").to_stream().to(output)
    else:
        (stream.flat_map_values(str.split).group_by(lambda _k, word: word)
            .count("counts").to_stream().to(output))
    return builder.build()


def target(kind: str, name: str, args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """What the row's ``TopicProcessor`` runs, and its stores."""
    if kind == "passthrough":
        return lambda _c: Passthrough(args.output), []
    if kind == "chain_hand":
        return lambda _c: ChainHand(args.output), []
    if kind.startswith(("count_hand", "wc_hand")):
        table = RocksDBTable("counts", key_serde="str", value_serde="json")
        lines = kind.startswith("wc_")
        return lambda c: CountHand(c, args.output, lines=lines), [table]
    return dsl_app(kind, name, args.source, args.output), []


def config_of(row: str, name: str, args: argparse.Namespace) -> Config:
    kind, _, setting = row.partition("-")
    text = kind not in ("passthrough", "dsl_chain", "chain_hand", "ceiling")
    if setting == "default":
        tuning: dict[str, Any] = {}
    elif setting == "best":
        tuning = TUNED
    elif setting == "wide":  # batches up to 10,000 with the latency target (a backlog's)
        tuning = {"batch_size": TUNED["batch_size"]}
    else:
        tuning = {"batch_size": args.batch_size, "batch_wait": 1.0}
    return Config(name=name, bootstrap_servers=args.bootstrap, input_topics=[args.source],
                  state_dir=args.state_dir, key_serde="str" if text else "bytes",
                  value_serde="json" if text else "bytes", **tuning)


def loop_child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one row to the end of its input (its repartitions' too): records/s and CPU
    per record (words for the word counts)."""
    row, name = args.child, f"bench-dsl-{args.child}-{uuid.uuid4().hex[:8]}"
    kind = row.partition("-")[0]
    lines = kind.startswith("wc_")
    total = _records(args.bootstrap, [args.source])
    counted = total * WORDS_PER_LINE if lines else total
    before, started, loop_before = _cpu(), time.perf_counter(), time.thread_time()
    if kind == "ceiling":
        _consume_only(args)
    else:
        runs, stores = target(kind, name, args)
        observer = StopWhenDrained(args.source, total, args.bootstrap)
        processor = TopicProcessor(config_of(row, name, args), runs, stores=stores,
                                   observer=observer)
        observer.processor = processor
        processor.run_loop()
    elapsed, cpu = time.perf_counter() - started, _cpu() - before
    loop_cpu = time.thread_time() - loop_before
    return {"kind": row, "name": name, "per_s": counted / elapsed,
            "cpu_us": cpu / counted * 1e6, "loop_us": loop_cpu / counted * 1e6}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _consume_only(args: argparse.Namespace) -> None:
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "enable.auto.commit": False,
                         "group.id": f"bench-dsl-ceiling-{uuid.uuid4().hex[:8]}", **DEEP})
    meta = consumer.list_topics(args.source, timeout=30).topics[args.source]
    consumer.assign([TopicPartition(args.source, p, OFFSET_BEGINNING) for p in meta.partitions])
    read, total = 0, _records(args.bootstrap, [args.source])
    while read < total:
        read += len(consumer.consume(args.batch_size, 1.0))
    consumer.close()


def run_child(row: str, args: argparse.Namespace, source: str, output: str, *,
              before: str | None = None) -> dict[str, Any]:
    """One row in a child (on the kasper_py in ``before`` when given: row ``…@before``);
    adds the records it sent to ``output`` and its repartitions."""
    sent = _records(args.bootstrap, [output])
    found = run_in_child(__file__, row, args, source, output, before=before)
    found["kind"] += "@before" if before is not None else ""
    found["outputs"] = _records(args.bootstrap, [output]) - sent
    found["load"] = os.getloadavg()[0]
    internal = [t for t in AdminClient({"bootstrap.servers": args.bootstrap}).list_topics(
        timeout=30).topics if t.startswith(found["name"] + "-")]
    found["repartitioned"] = _records(args.bootstrap, [t for t in internal
                                                       if t.endswith("-repartition")])
    if internal:
        delete_topics(args.bootstrap, internal)
    return found


def _records(bootstrap: str, topics: list[str]) -> int:
    """The records ``topics`` hold (their end offsets, summed)."""
    if not topics:
        return 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=30).topics
    return sum(_end_offsets(bootstrap, [(t, p) for t in topics
                                        for p in metadata[t].partitions]).values())


def inputs(messages: int, lines: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(``messages`` words keyed by word, valued 1), (``lines`` lines of five words,
    JSON strings), from a seeded shuffle of the vocabulary."""
    rng = random.Random(34)
    words = [rng.choice(VOCABULARY) for _ in range(max(messages, lines * WORDS_PER_LINE))]
    keyed = [{"key": w.encode(), "value": b"1"} for w in words[:messages]]
    text = [{"value": json.dumps(" ".join(words[n:n + WORDS_PER_LINE])).encode()}
            for n in range(0, lines * WORDS_PER_LINE, WORDS_PER_LINE)]
    return keyed, text


BASELINE = {"passthrough": "ceiling", "dsl_chain": "passthrough", "chain_hand": "passthrough",
            "count_hand": "passthrough", "dsl_count": "count_hand",
            "dsl_count_latest": "dsl_count"}
"""Each row's ratio is of its records/s to its baseline's (a word count's: to
``wc_hand-best``, the hand-written count at its best settings)."""
RATIOS = (("dsl_chain", "passthrough", "(target >= 0.95)"),
          ("dsl_chain", "chain_hand", "(the same functions, hand-written)"),
          ("dsl_count", "count_hand", "(keyed input, no repartition)"),
          ("wc_dsl-default", "wc_hand-best", "(target >= 0.5)"),
          ("wc_dsl-best", "wc_hand-best", ""),
          ("wc_dsl_uncached-best", "wc_hand-best", "(no cache: every word repartitioned)"),
          ("wc_dsl_uncached-default", "wc_hand-best", "(no cache, defaults)"),
          ("wc_hand-default", "wc_hand-best", "(defaults against best-tuned)"),
          ("dsl_count_latest", "dsl_count", '(timestamps="latest" against the default)'),
          ("wc_dsl_latest-best", "wc_dsl-best", '(timestamps="latest" against the default)'),
          ("wc_dsl-best", "wc_dsl_plain-best", "(packed repartition records against plain)"),
          ("wc_dsl-default", "wc_dsl_plain-default", "(packed against plain, defaults)"),
          ("wc_dsl_uncached-best", "wc_dsl_uncached_plain-best",
           "(packed against plain, every word repartitioned)"),
          ("wc_dsl_uncached-default", "wc_dsl_uncached_plain-default",
           "(packed against plain, every word repartitioned, defaults)"))


def baseline(kind: str) -> str | None:
    row, at, before = kind.partition("@")
    if row.startswith("wc_"):
        found = None if row == "wc_hand-best" else "wc_hand-best"
    else:
        found = BASELINE.get(row)
    return found and found + at + before


def show(row: dict[str, Any], best: dict[str, dict[str, Any]] | None = None) -> str:
    unit = "words/s" if row["kind"].startswith("wc_") else "recs/s "
    base = baseline(row["kind"])
    ratio = (f" {row['per_s'] / best[base]['per_s']:5.2f}x {base}"
             if best is not None and base in best else "")
    return (f"  {row['kind']:32} {row['per_s']:>10,.0f} {unit} {row['cpu_us']:>6.2f} us CPU "
            f"(loop {row.get('loop_us', 0.0):5.2f}) {row['outputs']:>9,} outputs "
            f"{row['repartitioned']:>9,} repartitioned  load {row['load']:4.2f}{ratio}")


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    best = {row: max(runs, key=lambda r: r["per_s"]) for row, runs in results.items()}
    print(f"\nbest of {args.rounds} rounds; {args.messages:,} keyed records (batch "
          f"{args.batch_size:,}), {args.lines:,} lines of {WORDS_PER_LINE} words; "
          f"{args.partitions} partitions; each row's ratio is to the row named after it:")
    for row in best.values():
        print(show(row, best))
    for suffix in ("", "@before") if args.before else ("",):
        for top, bottom, note in RATIOS:
            if top + suffix in best and bottom + suffix in best:
                print(f"  {top + suffix + ' / ' + bottom + suffix:52} "
                      f"{_ratios(results, top + suffix, bottom + suffix)}  {note}")
    for row in results if args.before else ():
        if not row.endswith("@before") and row + "@before" in results:
            print(f"  {row + ' now / before':52} {_ratios(results, row, row + '@before')}"
                  f"  loop thread µs a record now / before: {_least(results, row):.3f} / "
                  f"{_least(results, row + '@before'):.3f}")


def _ratios(results: dict[str, list[dict[str, Any]]], top: str, bottom: str) -> str:
    """Best records/s of ``top`` over ``bottom``'s, then each round's; and the loop
    thread's CPU a record, least over the rounds and each round's (CPU time: what a
    loaded machine disturbs least)."""
    best = max(r["per_s"] for r in results[top]) / max(r["per_s"] for r in results[bottom])
    rounds = ", ".join(f"{a['per_s'] / b['per_s']:.2f}"
                       for a, b in zip(results[top], results[bottom], strict=True))
    loop = ", ".join(f"{a['loop_us'] / b['loop_us']:.2f}"
                     for a, b in zip(results[top], results[bottom], strict=True))
    return (f"{best:5.2f} (by round {rounds}); loop thread a record "
            f"{_least(results, top) / _least(results, bottom):.2f} (by round {loop})")


def _least(results: dict[str, list[dict[str, Any]]], row: str) -> float:
    return min(r["loop_us"] for r in results[row])


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=400_000, partitions=2)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated, of {', '.join(ROWS + OPTIONAL)}")
    parser.add_argument("--child", choices=ROWS + OPTIONAL)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--before", help="a folder holding another kasper_py: every row "
                                         "runs on it too, alternating, as row@before")
    args = parser.parse_args()
    if child_answered(args, loop_child):
        return
    rows = args.rows.split(",")
    run = uuid.uuid4().hex[:8]
    words, lines, output = (f"bench-dsl-{what}-{run}" for what in ("words", "lines", "out"))
    create_topics(args.bootstrap, [words, lines, output], args.partitions)
    keyed, text = inputs(args.messages, args.lines)
    fill(args.bootstrap, words, args.partitions, keyed)
    fill(args.bootstrap, lines, args.partitions, text)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for round_ in range(args.rounds):  # alternate, so compared rows see the same machine
            # and turn the order round from round to round: no row always runs first
            for row in rows[round_ % len(rows):] + rows[:round_ % len(rows)]:
                for before in (None, args.before) if args.before else (None,):
                    source = words if row in KEYED + KEYED_OPTIONAL else lines
                    r = run_child(row, args, source, output, before=before)
                    results.setdefault(r["kind"], []).append(r)
                    print(show(r), flush=True)
        report(results, args)
    finally:
        delete_topics(args.bootstrap, [words, lines, output])


if __name__ == "__main__":
    main()
