"""Re-keyed word count: a two-stage application against the one-stage count of the same
input, and the consume-only ceiling, in the same run on the same broker.

The input is --messages lines of about --words words each (a 1000-word vocabulary),
keyed by document (``doc-<n>``), JSON strings. Rows, each in its own child process
(its CPU and peak RSS are its own), reading all of the input from the beginning in a
fresh group, at-least-once, Kasper's classic batches of --batch-size (10,000;
``--max-latency`` runs the latency target instead), batch_wait 0.1 s (with a backlog
batches fill at once; the wait only delays the last, partial batch of the repartition
topic, which would otherwise add up to a second to a two-stage row):

``ceiling``    consume(batch, 1.0) until every line is read, touching none (the deep
               prefetch ceiling of bench_passthrough.py).
``one-stage``  one MessageProcessor splits each line and adds its words to a count per
               word in a MemoryTable (one get_many and one put_many per partition and
               batch): no re-key, so a word's count is split over the partitions.
``two-stage``  an App: ``split`` sends every word to the repartition ``by-word``, a
               batch's words in one ``sender.repartition_many("by-word", ...)`` call
               (``--per-record``: ``sender.repartition("by-word", 1, key=word)`` each),
               ``count`` reads it and keeps the same counts per word, each now on the
               partition its word hashes to. Every word crosses Kafka a second time
               (produced, acked, consumed, committed), hence the target: at least 0.5
               of the one-stage rate in lines/s.
``dsl-packed``, the two-stage count in the streams DSL (``kasper_py.dsl``):
``dsl-plain``  ``flat_map(split).repartition(name="by-word").peek(tally)
               .group_by_key().count("counts", cache=False)`` (one get_many and one
               put_many a batch, as ``count``; the ``peek`` tallies the words for the
               stop), its repartition records packed (the default with the ``str``
               key serde: one Kafka record per destination partition and turn) or
               plain (``pack_repartitions=False``).
``combined``   the two-stage app with ``split`` counting each batch's words first and
               sending a word's count once a batch (``repartition("by-word", n,
               key=word)``): what a user does when the re-keyed records, not the
               lines, are the cost (at most one record per word of the vocabulary per
               partition and batch).

Each row reports lines/s and words/s (wall time from the loop's start to the commit
of the last record), CPU seconds per million lines (the process, every thread, from
getrusage; and the loop thread alone), and peak RSS; the words it counted are checked
against the input's. Rounds run the rows in the same order; the table keeps each
row's best round. The repartition hop's cost is the two-stage row's loop thread less
the one-stage row's, per word: what producing, acking, consuming, decoding and
committing each word a second time costs (the words of a line are split in both).
The DSL rows' hop, packed and plain, is computed the same way, and their ratio printed
(alternated in each round, so both see the same machine).
``--before DIR`` runs the one-stage and two-stage rows a second time in each round on
the kasper_py found in DIR (say a ``git archive`` of an older commit), right after
this checkout's, and prints the hop of both and their ratio: an A/B on the same
broker and input, in the same machine state. A benchmark, not a test: targets are
printed, never asserted. ``--profile FILE`` writes a cProfile of the two-stage loop
thread (one extra run).

    python bench/bench_app.py --messages 200000 --rounds 2
    git archive HEAD~3 kasper_py | tar -x -C /tmp/before
    python bench/bench_app.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import structlog
from bench_passthrough import Row, ceiling_loop, cpu_seconds, peak_rss_mib
from benchkit import arguments, child_env, create_topics, delete_topics, fill

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.stores.memory import MemoryTable

ROWS = ("ceiling", "one-stage", "two-stage", "dsl-packed", "dsl-plain", "combined")
AB_ROWS = ("one-stage", "two-stage")
"""The rows ``--before`` runs on the other kasper_py too."""
VOCABULARY = [f"w{n}" for n in range(1000)]


def lines(count: int, words: int) -> tuple[list[dict[str, Any]], int]:
    """``count`` produce_batch records of ``words`` words give or take one, keyed by
    document (100 documents); and the number of words in all."""
    rng = random.Random(27)
    records, total = [], 0
    for n in range(count):
        line = rng.choices(VOCABULARY, k=words + n % 3 - 1)
        total += len(line)
        records.append({"key": b"doc-%d" % (n % 100), "value": json.dumps(" ".join(line))})
    return records, total


def add_counts(counts: Any, words: Counter[str]) -> None:
    """Add ``words`` to the store ``counts``: one get_many, one put_many."""
    totals = counts.get_many(words)
    counts.put_many({word: totals.get(word, 0) + n for word, n in words.items()})


class CountWords(MessageProcessor):
    """The one-stage count: each line's words into this partition's counts."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")
        self.counted = 0

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = Counter(word for m in messages for word in m.value.split())
        add_counts(self.counts, words)
        self.counted += words.total()


class Split(MessageProcessor):
    """The two-stage app's first step: every word of a line to ``by-word``, keyed by it,
    the batch's words in one call (a kasper_py without ``repartition_many``, as an older
    one given to ``--before``, sends them one by one, as ``SplitEach``)."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        repartition_many = getattr(sender, "repartition_many", None)
        if repartition_many is None:
            SplitEach.process(self, messages, sender)  # type: ignore[arg-type]
            return
        repartition_many("by-word", [(word, 1, None, None) for m in messages
                                     for word in m.value.split()])


class SplitEach(MessageProcessor):
    """``Split`` sending word by word, ``sender.repartition`` per word."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        repartition = sender.repartition
        for m in messages:
            for word in m.value.split():
                repartition("by-word", 1, key=word)


class SplitCombined(MessageProcessor):
    """The combined row's first step: a batch's count of each word to ``by-word``."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = Counter(word for m in messages for word in m.value.split())
        for word, n in words.items():
            sender.repartition("by-word", n, key=word)


class CountRepartitioned(MessageProcessor):
    """The two-stage app's second step: the words of its partition into its counts
    (each record a word, or with ``combined`` a word's count in a batch)."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")
        self.counted = 0

    def process(self, messages: list[Message], sender: Sender) -> None:
        words: Counter[str] = Counter()
        for m in messages:
            words[m.key] += m.value
        add_counts(self.counts, words)
        self.counted += words.total()


def word_count_app(source: str, count: Any, *, combined: bool = False,
                   per_record: bool = False) -> App:
    """Split the lines of ``source`` (``combined``: counted per batch first; else in one
    call a batch, or ``per_record``), repartition by word, ``count`` (a factory)."""
    app = App("bench-app")
    by_word = app.repartition("by-word")
    split = SplitCombined if combined else SplitEach if per_record else Split
    app.processor("split", split, inputs=[source], outputs=[by_word])
    app.processor("count", count, inputs=[by_word], stores=[MemoryTable("counts")])
    return app


class Tally:
    """The words a DSL row's second stage has seen (its ``peek``)."""

    def __init__(self) -> None:
        self.counted = 0

    def add(self, _key: Any, _value: Any) -> None:
        self.counted += 1


def dsl_word_count(source: str, tally: Tally, *, packed: bool) -> App:
    """The DSL rows' app: split, repartition by word (``packed`` or plain), count."""
    builder = Builder("bench-app", stores="memory", pack_repartitions=None if packed else False)
    (builder.stream(source).flat_map(lambda _doc, line: [(w, 1) for w in line.split()])
        .repartition(name="by-word").peek(tally.add)
        .group_by_key().count("counts", cache=False))
    return builder.build()


class StopWhenCounted(NoopObserver):
    """Stops the loop after the turn that counts the last word of the input (in the
    two-stage rows the loop reads the lines, then the words again from the repartition
    topic)."""

    def __init__(self, counters: list[Any], total: int) -> None:
        self.counters, self.total = counters, total
        self.processor: TopicProcessor | None = None

    def on_turn(self, stats: TurnStats) -> None:
        if self.processor is not None and sum(c.counted for c in self.counters) >= self.total:
            self.processor.close()


def kasper_loop(args: argparse.Namespace) -> dict[str, Any]:
    """Run the one-stage or two-stage row until every record it reads is committed; its
    config's name (its repartition topic's prefix) and the words it counted."""
    config = Config(name=f"bench-app-{uuid.uuid4().hex[:8]}", bootstrap_servers=args.bootstrap,
                    input_topics=[args.source], batch_size=args.batch_size, batch_wait=0.1,
                    max_latency=args.max_latency, key_serde="str", value_serde="json")
    counters: list[CountWords | CountRepartitioned | Tally] = []

    def kept(kind: type[CountWords] | type[CountRepartitioned]) -> Any:
        def build(context: ProcessorContext) -> CountWords | CountRepartitioned:
            counters.append(kind(context))
            return counters[-1]
        return build

    observer = StopWhenCounted(counters, args.total_words)
    if args.child == "one-stage":
        processor = TopicProcessor(config, kept(CountWords), stores=[MemoryTable("counts")],
                                   observer=observer)
    elif args.child.startswith("dsl"):
        counters.append(Tally())
        app = dsl_word_count(args.source, counters[-1], packed=args.child == "dsl-packed")
        processor = TopicProcessor(config, app, observer=observer)
    else:
        app = word_count_app(args.source, kept(CountRepartitioned),
                             combined=args.child == "combined", per_record=args.per_record)
        processor = TopicProcessor(config, app, observer=observer)
    observer.processor = processor
    processor.run_loop()
    return {"name": config.name, "counted": sum(c.counted for c in counters)}


def kasper_py_dir() -> str:
    """Where the kasper_py this process runs lives, to tell A/B rows apart."""
    import kasper_py

    return os.path.dirname(os.path.dirname(os.path.abspath(kasper_py.__file__)))


def child(args: argparse.Namespace) -> None:
    """Run one row and print its figures as one JSON line."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    profile = cProfile.Profile() if args.profile else None
    cpu_before, started, loop_before = cpu_seconds(), time.perf_counter(), time.thread_time()
    if args.child == "ceiling":
        ceiling_loop(Row("ceiling", "deep", args.batch_size), args)
        found: dict[str, Any] = {"name": None, "counted": None}
    elif profile is not None:
        found = profile.runcall(kasper_loop, args)
    else:
        found = kasper_loop(args)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    loop_cpu = time.thread_time() - loop_before
    if profile is not None:
        profile.dump_stats(args.profile)
    lines_per_s = args.messages / elapsed
    print(json.dumps({**found, "row": args.child, "kasper_py": kasper_py_dir(),
                      "seconds": elapsed, "lines_per_s": lines_per_s,
                      "words_per_s": lines_per_s * args.total_words / args.messages,
                      "cpu_s_per_million": cpu * 1e6 / args.messages,
                      "loop_cpu_s_per_million": loop_cpu * 1e6 / args.messages,
                      "peak_rss_mib": peak_rss_mib()}))


def run_child(row: str, args: argparse.Namespace, source: str, total_words: int, *,
              profile: str | None = None, before: str | None = None) -> dict[str, Any]:
    """One row in a fresh process (on the kasper_py in ``before`` when given); its
    repartition topic deleted after."""
    cmd = [sys.executable, __file__, "--child", row, "--bootstrap", args.bootstrap,
           "--source", source, "--messages", str(args.messages), "--total-words",
           str(total_words), "--batch-size", str(args.batch_size),
           "--max-latency", str(args.max_latency).lower(),
           *(["--per-record"] if args.per_record else []),
           *(["--profile", profile] if profile else [])]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True,
                            env=child_env(before))
    if result.returncode:
        sys.exit(f"{row} failed:\n{result.stderr[-3000:]}")
    found = dict(json.loads(result.stdout.strip().splitlines()[-1]))
    found["row"] += "@before" if before is not None else ""
    if found["name"] is not None and not row.startswith("one-stage"):
        delete_topics(args.bootstrap, [f"{found['name']}-by-word-repartition"])
    return found


def row_line(r: dict[str, Any], total_words: int) -> str:
    counted = "" if r["counted"] is None else (
        f"  words counted {r['counted']:,}{'' if r['counted'] == total_words else ' (WRONG)'}")
    return (f"  {r['row']:17} {r['lines_per_s']:>10,.0f} lines/s {r['words_per_s']:>11,.0f} "
            f"words/s  {r['seconds']:6.2f} s  CPU {r['cpu_s_per_million']:6.2f} s/1M lines "
            f"(loop thread {r['loop_cpu_s_per_million']:6.2f})  peak RSS "
            f"{r['peak_rss_mib']:4.0f} MiB{counted}")


def hop_us(results: dict[str, list[dict[str, Any]]], lines_per_word: float,
           suffix: str = "", two_stage: str = "two-stage") -> float:
    """The repartition hop in µs of loop thread a word: the ``two_stage`` row's less the
    one-stage row's, each its least over the rounds (the least disturbed)."""
    two, one = (min(r["loop_cpu_s_per_million"] for r in results[row + suffix])
                for row in (two_stage, "one-stage"))
    return (two - one) * lines_per_word  # s per million lines is µs a line


def dsl_hops(results: dict[str, list[dict[str, Any]]], lines_per_word: float
             ) -> Iterator[str]:
    """The DSL rows' hop, packed and plain, least of the rounds and by round."""
    packed, plain = (hop_us(results, lines_per_word, two_stage=row)
                     for row in ("dsl-packed", "dsl-plain"))
    yield (f"DSL repartition hop (dsl-* - one-stage loop thread): packed {packed:.2f}, plain "
           f"{plain:.2f} µs a word; packed / plain {packed / plain:.2f} (target <= 0.5)")
    one = results["one-stage"]
    for n, (a, b, base) in enumerate(zip(results["dsl-packed"], results["dsl-plain"], one,
                                         strict=True)):
        hops = [(r["loop_cpu_s_per_million"] - base["loop_cpu_s_per_million"])
                * lines_per_word for r in (a, b)]
        yield (f"  round {n + 1}: packed {hops[0]:.2f}, plain {hops[1]:.2f} µs a word "
               f"({hops[0] / hops[1]:.2f}); the DSL rows' loop thread a word: packed "
               f"{a['loop_cpu_s_per_million'] * lines_per_word:.2f}, plain "
               f"{b['loop_cpu_s_per_million'] * lines_per_word:.2f} µs")


def summary(results: dict[str, list[dict[str, Any]]], total_words: int,
            lines: int) -> Iterator[str]:
    best = {row: max(runs, key=lambda r: r["lines_per_s"]) for row, runs in results.items()}
    yield "best of the rounds:"
    for found in best.values():
        yield row_line(found, total_words)
    hop = hop_us(results, lines / total_words)
    yield f"repartition hop (two-stage - one-stage loop thread): {hop:.2f} µs a word"
    if "two-stage@before" in results:
        before = hop_us(results, lines / total_words, "@before")
        yield (f"  before ({best['two-stage@before']['kasper_py']}): {before:.2f} µs a word; "
               f"now / before: {hop / before:.2f} (target <= 0.5)")
    yield from dsl_hops(results, lines / total_words)
    two, one = best["two-stage"], best["one-stage"]
    yield (f"two-stage / one-stage, lines/s: {two['lines_per_s'] / one['lines_per_s']:.2f} "
           "(target >= 0.5)")
    yield (f"two-stage / one-stage, CPU per line: "
           f"{two['cpu_s_per_million'] / one['cpu_s_per_million']:.2f} (loop thread "
           f"{two['loop_cpu_s_per_million'] / one['loop_cpu_s_per_million']:.2f})")
    combined = best["combined"]
    yield (f"combined / one-stage, lines/s: "
           f"{combined['lines_per_s'] / one['lines_per_s']:.2f}")
    ceiling = best["ceiling"]["lines_per_s"]
    yield (f"against the consume-only ceiling, lines/s: one-stage "
           f"{one['lines_per_s'] / ceiling:.2f}, two-stage {two['lines_per_s'] / ceiling:.2f}")


def latency(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def parse() -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0], messages=200_000, partitions=2)
    parser.add_argument("--words", type=int, default=5, help="words per line, give or take one")
    parser.add_argument("--max-latency", type=latency, default=None,
                        help="Config.max_latency, seconds, or none (classic batches, the "
                             "default here: the hop's cost, not the batch sizing)")
    parser.add_argument("--per-record", action="store_true",
                        help="split sends word by word (sender.repartition), not a batch")
    parser.add_argument("--before", help="a folder holding another kasper_py: A/B its "
                                         "one-stage and two-stage rows against this one's")
    parser.add_argument("--profile", help="write a cProfile of the two-stage loop here")
    parser.add_argument("--profile-row", default="two-stage", choices=ROWS[1:],
                        help="the row --profile profiles")
    parser.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--total-words", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.child:
        child(args)
        return
    source = f"bench-lines-{uuid.uuid4().hex[:8]}"
    records, total_words = lines(args.messages, args.words)
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions, records)
    del records
    print(f"input: {args.messages:,} lines, {total_words:,} words ({args.words} a line, give "
          f"or take one) on {args.partitions} partitions, batch_size {args.batch_size}, "
          f"max_latency {args.max_latency}, split "
          f"{'per record' if args.per_record else 'a batch a call'}, {args.rounds} round(s)",
          flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(args.rounds):
            for row in ROWS:
                for before in (None, args.before) if args.before and row in AB_ROWS else (None,):
                    found = run_child(row, args, source, total_words, before=before)
                    results.setdefault(found["row"], []).append(found)
                    print(row_line(found, total_words), flush=True)
        if args.profile:
            run_child(args.profile_row, args, source, total_words, profile=args.profile)
            print(f"profile of a {args.profile_row} run: {args.profile}")
    finally:
        delete_topics(args.bootstrap, [source])
    for line in summary(results, total_words, args.messages):
        print(line)


if __name__ == "__main__":
    main()
