"""kasper_py's defaults against its best-tuned settings, on backlogs: a passthrough and a
hand-written word count, with the consume-only ceiling and exactly-once beside them, in
one run on the same broker.

Two input topics are filled once: ``--messages`` values of 100 bytes on 4 partitions
(the passthrough's), and ``--lines`` lines of five words drawn from a 10,000-word
vocabulary on 2 partitions (the word count's). Every row reads all of its input from
the start in a fresh group, in its own child process (its CPU and peak RSS are its
own). A row is ``work-setting``:

works
    ``ceiling``      consume(10,000, 1.0) until every value is read, touching none (deep
                     prefetch: bench_passthrough's ceiling).
    ``passthrough``  a ``Passthrough`` processor copying every message to an output topic.
    ``wordcount``    a processor counting each batch's words into a partition-local
                     RocksDB table (one ``get_many``, one ``put_many`` a batch) and sending
                     each changed total once a batch: fewer outputs with larger batches.
settings
    ``defaults``     ``Config``'s own defaults: nothing about batches is set.
    ``tuned``        the best hand-tuned setting: ``batch_size=10000, max_latency=None``.
    ``eos``          the defaults with ``processing_guarantee="exactly_once"``.
    ``classicN``     ``batch_size=N, max_latency=None``; ``autoN``: ``batch_size=N`` with
                     the default latency target; ``bytesN``: ``batch_bytes=N`` with the
                     default latency target (for sweeps, with ``--rows``).

Each row reports msgs/s (wall time from the loop's start to the commit of its last
input), CPU seconds per million inputs (the process, every thread; and the loop thread
alone), peak RSS, turns and their mean batch, the outputs sent, and the load average as
it ended. ``--warmup`` rows (the first kasper_py row of each work) run once before the
rounds and are not kept. Each round runs every row, the order turned round by one row
from round to round; the table keeps each row's best round, and the ratios are of
those (and of each round, with their median).
A benchmark, not a test: the targets are printed, never asserted.

    python bench/bench_defaults.py
    python bench/bench_defaults.py --rounds 1 --rows wordcount-classic1000,wordcount-auto50000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import structlog
from bench_passthrough import Row, ceiling_loop, cpu_seconds, peak_rss_mib
from benchkit import (
    Passthrough,
    StopWhenDone,
    WordCount,
    arguments,
    create_topics,
    delete_topics,
    fill,
    payloads,
)

from kasper_py import Config, MessageProcessor, ProcessorContext, TopicProcessor
from kasper_py.kafka.topics import changelog_topic
from kasper_py.stores.rocksdb import RocksDBTable

ROWS = ("ceiling-deep", "passthrough-defaults", "passthrough-tuned", "passthrough-eos",
        "wordcount-defaults", "wordcount-tuned", "wordcount-eos")
VOCABULARY = [f"word{n}" for n in range(10_000)]
RATIOS = (("passthrough-defaults", "passthrough-tuned", ">= 0.9"),
          ("wordcount-defaults", "wordcount-tuned", ">= 0.9"),
          ("passthrough-eos", "passthrough-defaults", ">= 0.85"),
          ("wordcount-eos", "wordcount-defaults", ""))


def settings(setting: str) -> dict[str, Any]:
    """The ``Config`` keyword arguments of a row's setting."""
    if setting == "defaults":
        return {}
    if setting == "tuned":
        return {"batch_size": 10_000, "max_latency": None}
    if setting == "eos":
        return {"processing_guarantee": "exactly_once"}
    if setting.startswith("classic"):
        return {"batch_size": int(setting.removeprefix("classic")), "max_latency": None}
    if setting.startswith("auto"):
        return {"batch_size": int(setting.removeprefix("auto"))}
    if setting.startswith("bytes"):
        return {"batch_bytes": int(setting.removeprefix("bytes"))}
    raise ValueError(f"unknown setting {setting!r}")


def lines(count: int) -> list[dict[str, Any]]:
    """``count`` produce_batch records: five words of the vocabulary, drawn at random."""
    rng = random.Random(34)
    return [{"value": " ".join(rng.choices(VOCABULARY, k=5)).encode()} for _ in range(count)]


# -- the child processes ----------------------------------------------------------------

def loop_child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one row to the end of its input; its figures."""
    work, _, setting = args.child.partition("-")
    count = work == "wordcount"
    config = Config(name=f"bench-defaults-{uuid.uuid4().hex[:8]}",
                    bootstrap_servers=args.bootstrap, input_topics=[args.source],
                    key_serde="str" if count else "bytes", value_serde="str" if count else "bytes",
                    state_dir=args.state_dir, **settings(setting))
    counters: list[WordCount] = []

    def factory(context: ProcessorContext) -> MessageProcessor:
        if not count:
            return Passthrough(args.output)
        counters.append(WordCount(context, args.output))
        return counters[-1]

    observer = StopWhenDone(args.messages)
    processor = TopicProcessor(config, factory, observer=observer,
                               stores=[RocksDBTable("counts")] if count else [])
    observer.processor = processor
    processor.run_loop()
    outputs = sum(c.sent for c in counters) if count else args.messages
    return {"name": config.name if count else None, "turns": len(observer.commits),
            "outputs": outputs}


def child(args: argparse.Namespace) -> None:
    """Run the row ``args.child`` (the clock starts after the imports, client creation
    included) and print its figures as one JSON line."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    cpu, started, loop = cpu_seconds(), time.perf_counter(), time.thread_time()
    if args.child.startswith("ceiling"):
        ceiling_loop(Row("ceiling", "deep", 10_000), args)
        found: dict[str, Any] = {"name": None, "turns": 0, "outputs": 0}
    else:
        found = loop_child(args)
    seconds = time.perf_counter() - started
    per_million = 1e6 / args.messages
    print(json.dumps({"row": args.child, "msgs_per_s": args.messages / seconds,
                      "seconds": seconds, "cpu_s_per_million": (cpu_seconds() - cpu) * per_million,
                      "loop_cpu_s_per_million": (time.thread_time() - loop) * per_million,
                      "peak_rss_mib": peak_rss_mib(), **found}))


# -- the parent ---------------------------------------------------------------------------

def run_child(row: str, args: argparse.Namespace, source: str, messages: int,
              partitions: int) -> dict[str, Any]:
    """One row in a fresh process, against its own output topic."""
    output = f"bench-defaults-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [output], partitions)
    with tempfile.TemporaryDirectory(prefix="kasper-bench-") as state_dir:
        cmd = [sys.executable, __file__, "--child", row, "--bootstrap", args.bootstrap,
               "--source", source, "--output", output, "--messages", str(messages),
               "--state-dir", state_dir]
        try:
            result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        finally:
            delete_topics(args.bootstrap, [output])
    if result.returncode:
        sys.exit(f"{row} failed:\n{result.stderr[-3000:]}")
    found = dict(json.loads(result.stdout.strip().splitlines()[-1]))
    found["load"] = os.getloadavg()[0]
    if found["name"]:  # the word count's table made its changelog
        delete_topics(args.bootstrap, [changelog_topic(found["name"], "counts")])
    return found


def row_line(result: Mapping[str, Any]) -> str:
    turns = result["turns"]
    batch = f"{result['msgs_per_s'] * result['seconds'] / turns:>9,.0f}" if turns else f"{'-':>9}"
    return (f"  {result['row']:28} {result['msgs_per_s']:>10,.0f} msgs/s  "
            f"CPU {result['cpu_s_per_million']:5.2f} s/1M "
            f"(loop {result['loop_cpu_s_per_million']:5.2f})"
            f"  RSS {result['peak_rss_mib']:4.0f} MiB  turns {turns:>5,}  mean batch {batch}"
            f"  outputs {result['outputs']:>9,}  load {result['load']:4.2f}")


def ratio_lines(results: Mapping[str, Sequence[Mapping[str, Any]]],
                best: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """Every row's best msgs/s against its work's tuned row and the ceiling; then the
    ratios with a target, of the best rounds and of each round (rows run side by side,
    so a round's ratio saw one machine)."""
    yield f"  {'row':28} {'x tuned':>8} {'x ceiling':>10}"
    ceiling = best.get("ceiling-deep", {}).get("msgs_per_s")
    for name, result in best.items():
        tuned = best.get(f"{name.partition('-')[0]}-tuned", {}).get("msgs_per_s")
        rate = result["msgs_per_s"]
        yield (f"  {name:28} {f'{rate / tuned:.2f}' if tuned else '-':>8} "
               f"{f'{rate / ceiling:.2f}' if ceiling else '-':>10}")
    for top, bottom, target in RATIOS:
        if top in best and bottom in best:
            ratio = best[top]["msgs_per_s"] / best[bottom]["msgs_per_s"]
            each = [a["msgs_per_s"] / b["msgs_per_s"]
                    for a, b in zip(results[top], results[bottom], strict=True)]
            yield (f"  {top} / {bottom}: {ratio:5.2f}, median of rounds "
                   f"{statistics.median(each):.2f}, by round "
                   f"{', '.join(f'{r:.2f}' for r in each)}  (target {target or 'none'})")


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0], messages=1_000_000, partitions=4, rounds=2,
                       batch_size=None)
    parser.add_argument("--lines", type=int, default=200_000,
                        help="lines of the word count's input (five words each)")
    parser.add_argument("--rows", type=lambda text: text.split(","), default=list(ROWS),
                        help="comma list of rows, e.g. passthrough-defaults,wordcount-auto50000")
    parser.add_argument("--warmup", type=int, default=2,
                        help="rows run once before the rounds and not kept (one a work)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for row in args.rows:
        work, _, setting = row.partition("-")
        if work not in ("ceiling", "passthrough", "wordcount") or (
                work != "ceiling" and not _known(setting)):
            parser.error(f"unknown row {row!r}")
    return args


def _known(setting: str) -> bool:
    try:
        settings(setting)
    except ValueError:
        return False
    return True


def run_input(row: str, args: argparse.Namespace, values: str, text: str) -> dict[str, Any]:
    """One run of ``row`` over its work's input topic (``values`` or ``text``)."""
    on_lines = row.startswith("wordcount")
    return run_child(row, args, text if on_lines else values,
                     args.lines if on_lines else args.messages, 2 if on_lines else args.partitions)


def warmup_rows(rows: Sequence[str]) -> list[str]:
    """One kasper_py row of each work in ``rows``: run once before the rounds and not
    kept, so no round's first row alone pays a first read of its input from the broker
    (in one run the first round's first row, passthrough-defaults, ran 281k msgs/s,
    348k and 399k in the later rounds)."""
    firsts = {row.partition("-")[0]: row for row in reversed(rows) if not row.startswith("ceiling")}
    return list(firsts.values())


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; passthrough "
          f"{args.messages:,} x 100 B on {args.partitions} partitions; word count "
          f"{args.lines:,} lines of 5 words (vocabulary {len(VOCABULARY):,}) on 2 partitions; "
          f"{args.rounds} round(s)", flush=True)
    run = uuid.uuid4().hex[:8]
    values, text = f"bench-defaults-values-{run}", f"bench-defaults-lines-{run}"
    create_topics(args.bootstrap, [values], args.partitions)
    create_topics(args.bootstrap, [text], 2)
    fill(args.bootstrap, values, args.partitions, payloads(args.messages, 100))
    fill(args.bootstrap, text, 2, lines(args.lines))
    results: dict[str, list[dict[str, Any]]] = {row: [] for row in args.rows}
    try:
        for row in warmup_rows(args.rows)[:args.warmup]:  # the broker's first reads, not kept
            print(row_line(run_input(row, args, values, text)) + "  (warm-up, not kept)",
                  flush=True)
        for round_ in range(args.rounds):
            # the rows turn round from round to round: none always runs first
            for row in args.rows[round_ % len(args.rows):] + args.rows[:round_ % len(args.rows)]:
                result = run_input(row, args, values, text)
                results[row].append(result)
                print(row_line(result), flush=True)
    finally:
        delete_topics(args.bootstrap, [values, text])
    best = {row: max(runs, key=lambda r: r["msgs_per_s"]) for row, runs in results.items()}
    print(f"best of {args.rounds} round(s):")
    print("\n".join(row_line(result) for result in best.values()))
    print("\n".join(ratio_lines(results, best)))
    print(f"load average after the run {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
