"""Passthrough throughput: kasper_py's TopicProcessor against a hand-written
confluent-kafka loop and a consume-only ceiling, at two consumer prefetch settings, and
both again exactly-once.

One input topic is filled once; every run reads all of it from the beginning with its
own fresh consumer group, in its own child process (peak RSS and CPU are its own), and
writes to its own output topic, deleted afterwards. A row is ``kind-settings-batch``:

kinds
    ``ceiling``     consume(batch, 1.0) until every message is read, touching none.
    ``raw``         what a careful user writes: consume a batch, produce() each message
                    (acks=all, idempotent, linger.ms=5, a 1M-message queue, delivery
                    reports for errors only, the first one raised after flush()), flush,
                    commit offset+1 per partition synchronously.
    ``raw_eos``     the raw loop exactly-once, as confluent's eos example writes it: a
                    transactional producer (retry.backoff.ms=10, as kasper's), the
                    consumer read_committed as every row's; per batch begin_transaction,
                    produce() each message, flush, send_offsets_to_transaction,
                    commit_transaction. The ceiling for exactly-once on this machine;
                    deep prefetch only.
    ``kasper``      the same work through TopicProcessor: a Passthrough processor,
                    stopped by an observer after the turn that commits the last message.
    ``kasper_eos``  kasper with processing_guarantee="exactly_once" (each turn one
                    transaction of its outputs and input offsets); own defaults only.
settings (the consumer's prefetch keys, the ones in ``DEEP``)
    ``librdkafka``  librdkafka's defaults; kasper gets them back as consumer_overrides,
                    so it is measured at the same fetch limits as the raw loop.
    ``deep``        ``DEEP``, given to every kind's consumer.
    ``own``         kasper only: kasper_py's own consumer settings, no overrides, in
                    classic batches of the row's size (``max_latency=None``), so every
                    row takes the same batches. bench_defaults.py measures the Config
                    defaults themselves (batches sized for a latency target).

The ceiling runs at the largest batch size only. Each child reports msgs/s and wall
seconds, client CPU seconds (user+sys of its own process, all threads included, from
getrusage around the loop: client creation to close, imports excluded), the loop
thread's own CPU seconds (the one Python thread, the part kasper_py adds to), peak RSS
(VmHWM), and the commit latency: median, p99 and max over its turns of the commit step
(raw: the synchronous offset commit; kasper: ``TurnStats.durations["commit"]``;
exactly-once: send_offsets_to_transaction and commit_transaction, after the acks).
Rounds run every row in the same order, so compared rows see the same machine; the
table keeps each row's best round. A benchmark, not a test: targets are printed next
to the ratios, never asserted.

    python bench/bench_passthrough.py --rounds 2
    python bench/bench_passthrough.py --messages 100000 --only raw-deep-1000,kasper-deep-1000
    python bench/bench_passthrough.py --messages 200000 --batch-sizes 10000 \
        --only kasper-own-10000,kasper_eos-own-10000,raw_eos-deep-10000
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from benchkit import (
    Passthrough,
    arguments,
    commit_latency,
    create_topics,
    delete_topics,
    fill,
    payloads,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

DEEP: dict[str, int] = {
    "queued.min.messages": 1_000_000,
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 100,
    "max.partition.fetch.bytes": 4 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "queued.max.messages.kbytes": 262144,
}
"""Deep prefetch, given to the consumer of every kind in the ``deep`` rows."""

LIBRDKAFKA_DEFAULTS: dict[str, int] = {
    "queued.min.messages": 100_000,
    "fetch.queue.backoff.ms": 1000,
    "fetch.wait.max.ms": 500,
    "max.partition.fetch.bytes": 1024 * 1024,
    "fetch.max.bytes": 50 * 1024 * 1024,
    "queued.max.messages.kbytes": 65536,
}
"""librdkafka's own defaults for the keys in ``DEEP`` (keep the two key sets equal)."""

# (kind, settings) in the order a round runs them at one batch size: each row right
# after the row it is compared with (kasper_eos after kasper-own, raw_eos after it).
PAIRS = (("raw", "librdkafka"), ("kasper", "librdkafka"), ("kasper", "own"),
         ("kasper_eos", "own"), ("raw_eos", "deep"), ("raw", "deep"), ("kasper", "deep"))


@dataclass(frozen=True)
class Row:
    """One line of the table: a loop, its consumer settings and its batch size."""

    kind: str
    settings: str
    batch_size: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.settings}-{self.batch_size}"

    @classmethod
    def parse(cls, name: str) -> Row:
        kind, settings, batch_size = name.split("-")
        return cls(kind, settings, int(batch_size))

    @property
    def exactly_once(self) -> bool:
        """Each batch is one transaction (``raw_eos``, ``kasper_eos``)."""
        return self.kind.endswith("_eos")

    def consumer_settings(self) -> dict[str, int]:
        """The prefetch keys this row adds to its consumer (kasper: as overrides)."""
        if self.settings == "deep":
            return DEEP
        if self.kind.startswith("kasper") and self.settings == "librdkafka":
            return LIBRDKAFKA_DEFAULTS
        return {}


def planned_rows(batch_sizes: Sequence[int]) -> list[Row]:
    """Every row of one round, in the order it runs."""
    rows = [Row("ceiling", settings, max(batch_sizes)) for settings in ("librdkafka", "deep")]
    for size in batch_sizes:
        rows += [Row(kind, settings, size) for kind, settings in PAIRS]
    return rows


def raw_consumer(row: Row, bootstrap: str, source: str, prefix: str) -> Consumer:
    """A consumer in a fresh group, assigned every partition of ``source`` from the start;
    read_committed, librdkafka's default (as exactly-once needs)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         **row.consumer_settings()})
    partitions = consumer.list_topics(source, timeout=30).topics[source].partitions
    consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in partitions])
    return consumer


def ceiling_loop(row: Row, args: argparse.Namespace) -> list[float]:
    """The ceiling: consume only, touching no message (and committing nothing)."""
    consumer = raw_consumer(row, args.bootstrap, args.source, "ceiling")
    done = 0
    while done < args.messages:
        done += len(consumer.consume(row.batch_size, 1.0))
    consumer.close()
    return []


class FirstDeliveryError:
    """The producer's ``on_delivery``: with error-only reports it runs only on failures,
    inside poll()/flush(), and keeps the first for the loop to raise before committing."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None and self.error is None:
            self.error = error

    def raise_if_any(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"delivery failed: {self.error.str()}")


def raw_producer(args: argparse.Namespace, failed: FirstDeliveryError,
                 **more: str | int | bool) -> Producer:
    """The raw loops' producer: acks=all, idempotent, linger.ms=5, a 1M-message queue,
    delivery reports for errors only (to ``failed``), plus the keys in ``more`` (the
    exactly-once loop's transactional ones; bench_latency's latency settings, which
    override these)."""
    return Producer({"bootstrap.servers": args.bootstrap, "acks": "all",
                     "enable.idempotence": True, "linger.ms": 5,
                     "queue.buffering.max.messages": 1_000_000,
                     "delivery.report.only.error": True, "on_delivery": failed,
                     **more})


def raw_loop(row: Row, args: argparse.Namespace) -> list[float]:
    """The baseline: confluent-kafka by hand, one produce() per message. Returns the
    seconds of each offset commit."""
    consumer = raw_consumer(row, args.bootstrap, args.source, "raw")
    failed = FirstDeliveryError()
    producer = raw_producer(args, failed)
    done, commits = 0, []
    while done < args.messages:
        batch = consumer.consume(row.batch_size, 1.0)
        offsets = produce_all(producer, args.output, batch)
        wait_for_acks(producer, failed)
        if offsets:
            started = time.perf_counter()
            consumer.commit(offsets=topic_partitions(offsets), asynchronous=False)
            commits.append(time.perf_counter() - started)
        done += len(batch)
    consumer.close()
    return commits


def raw_eos_loop(row: Row, args: argparse.Namespace) -> list[float]:
    """The baseline exactly-once: each batch one transaction of its outputs and its
    input offsets. The acks are awaited before the commit, as kasper does, so the
    commit's seconds (returned, one per transaction) are its own round trips."""
    consumer = raw_consumer(row, args.bootstrap, args.source, "raw-eos")
    failed = FirstDeliveryError()
    producer = raw_producer(args, failed, **{"transactional.id": f"raw-eos-{uuid.uuid4()}",
                                             "retry.backoff.ms": 10})
    producer.init_transactions(60)
    done, commits = 0, []
    while done < args.messages:
        batch = consumer.consume(row.batch_size, 1.0)
        if not batch:
            continue
        producer.begin_transaction()
        offsets = produce_all(producer, args.output, batch)
        wait_for_acks(producer, failed)
        started = time.perf_counter()
        producer.send_offsets_to_transaction(topic_partitions(offsets),
                                             consumer.consumer_group_metadata(), 60)
        producer.commit_transaction(60)
        commits.append(time.perf_counter() - started)
        done += len(batch)
    consumer.close()
    return commits


def wait_for_acks(producer: Producer, failed: FirstDeliveryError) -> None:
    if producer.flush(60):
        raise RuntimeError("messages still unacknowledged after 60 s")
    failed.raise_if_any()


def topic_partitions(offsets: Mapping[tuple[str, int], int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]


def produce_all(producer: Producer, output: str, batch: list[Any]) -> dict[tuple[str, int], int]:
    """Produce ``batch`` to ``output``, same partition; the next offset per partition."""
    offsets: dict[tuple[str, int], int] = {}
    for msg in batch:
        if msg.error():
            raise RuntimeError(f"consume failed: {msg.error().str()}")
        while True:
            try:
                producer.produce(output, msg.value(), msg.key(), msg.partition())
                break
            except BufferError:
                producer.poll(0.05)
        offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
    return offsets


def kasper_loop(row: Row, args: argparse.Namespace) -> list[float]:
    """The same work through TopicProcessor, exactly-once for ``kasper_eos``. Returns
    each turn's commit seconds (exactly-once: its transaction's commit)."""
    import logging

    import structlog

    from kasper_py import Config, TopicProcessor
    from kasper_py.observability.observe import NoopObserver, TurnStats

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    output, total = args.output, args.messages

    class StopWhenDone(NoopObserver):
        """Stops the loop after the turn that commits the last message, as the raw loop
        does; keeps each turn's commit seconds."""

        def __init__(self) -> None:
            self.done = 0
            self.commits: list[float] = []

        def on_turn(self, stats: TurnStats) -> None:
            self.done += len(stats.batch)
            self.commits.append(stats.durations["commit"])
            if self.done >= total:
                processor.close()

    config = Config(name=f"bench-{uuid.uuid4()}", bootstrap_servers=args.bootstrap,
                    input_topics=[args.source], batch_size=row.batch_size, batch_wait=1.0,
                    consumer_overrides=row.consumer_settings(), max_latency=None,
                    processing_guarantee="exactly_once" if row.exactly_once else "at_least_once")
    observer = StopWhenDone()
    processor = TopicProcessor(config, lambda _c: Passthrough(output), observer=observer)
    processor.run_loop()
    return observer.commits


LOOPS = {"ceiling": ceiling_loop, "raw": raw_loop, "raw_eos": raw_eos_loop,
         "kasper": kasper_loop, "kasper_eos": kasper_loop}


def child(args: argparse.Namespace) -> None:
    """Run one row's loop and print its figures as one JSON line."""
    row = Row.parse(args.child)
    if row.kind.startswith("kasper"):  # imported before the clock starts, as the raw loop's are
        importlib.import_module("kasper_py")
    cpu_before, started, loop_before = cpu_seconds(), time.perf_counter(), time.thread_time()
    commits = LOOPS[row.kind](row, args)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    loop_cpu = time.thread_time() - loop_before
    print(json.dumps({"row": row.name, "seconds": elapsed, "msgs_per_s": args.messages / elapsed,
                      "cpu_s": cpu, "cpu_s_per_million": cpu * 1e6 / args.messages,
                      "loop_cpu_s_per_million": loop_cpu * 1e6 / args.messages,
                      "peak_rss_mib": peak_rss_mib(), **commit_latency(commits),
                      "library": getattr(sys.modules.get("kasper_py"), "__file__", None)}))


def cpu_seconds() -> float:
    """User + system CPU of this process so far, every thread (librdkafka's) included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """This process's own peak RSS. Linux keeps ``ru_maxrss`` across exec, so a child
    forked from the bench (which holds the input payloads) would report the parent's
    size; VmHWM belongs to the exec'd image alone."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(row: Row, args: argparse.Namespace, source: str) -> dict[str, Any]:
    """One row in a fresh process, against its own output topic (the ceiling has none)."""
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    if row.kind != "ceiling":
        create_topics(args.bootstrap, [output], args.partitions)
    cmd = [sys.executable, __file__, "--child", row.name, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages)]
    try:
        result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{row.name} failed:\n{exc.stderr}")
    finally:
        if row.kind != "ceiling":
            delete_topics(args.bootstrap, [output])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@dataclass(frozen=True)
class Ratio:
    """A ratio of two rows' figure at each batch size, and its target if it has one."""

    title: str
    numerator: str
    """Row name without its batch size, e.g. ``kasper-deep``."""
    denominator: str
    figure: str
    targets: Mapping[int, str] | str = ""
    """The target at every batch size, or per batch size; empty: no target."""

    def target(self, batch_size: int) -> str:
        if isinstance(self.targets, str):
            return self.targets
        return self.targets.get(batch_size, "")


RATIOS = (
    Ratio("kasper/raw msgs/s, deep prefetch on both", "kasper-deep", "raw-deep", "msgs_per_s",
          {10_000: ">= 0.9", 1_000: ">= 0.8"}),
    Ratio("kasper/raw msgs/s, librdkafka settings on both", "kasper-librdkafka",
          "raw-librdkafka", "msgs_per_s"),
    Ratio("kasper own defaults / raw librdkafka defaults, msgs/s", "kasper-own",
          "raw-librdkafka", "msgs_per_s", ">= 2"),
    Ratio("CPU per message kasper/raw, deep prefetch on both", "kasper-deep", "raw-deep",
          "cpu_s_per_million", "<= 1.3"),
    Ratio("loop thread's CPU per message kasper/raw, deep prefetch on both", "kasper-deep",
          "raw-deep", "loop_cpu_s_per_million"),
    Ratio("exactly-once / at-least-once msgs/s (own defaults)", "kasper_eos-own", "kasper-own",
          "msgs_per_s", {10_000: ">= 0.85"}),
    Ratio("raw exactly-once / raw at-least-once msgs/s, deep prefetch on both", "raw_eos-deep",
          "raw-deep", "msgs_per_s"),
    Ratio("kasper exactly-once own defaults / raw exactly-once deep, msgs/s", "kasper_eos-own",
          "raw_eos-deep", "msgs_per_s"),
)


def ratio_lines(best: Mapping[str, dict[str, Any]], batch_sizes: Sequence[int]) -> Iterator[str]:
    """The ratios whose two rows ran, each with its target."""
    for ratio in RATIOS:
        yield f"{ratio.title}:"
        for size in batch_sizes:
            top = best.get(f"{ratio.numerator}-{size}")
            bottom = best.get(f"{ratio.denominator}-{size}")
            if top is None or bottom is None:
                yield f"  batch {size:>6,}: not run"
                continue
            target = ratio.target(size)
            yield (f"  batch {size:>6,}: {top[ratio.figure] / bottom[ratio.figure]:5.2f}"
                   f"  (target {target or 'none'})")
    ceiling = next((r for name, r in best.items() if name.startswith("ceiling-deep-")), None)
    if ceiling is None:
        return
    yield "every row / ceiling-deep, msgs/s:"
    for name, result in best.items():
        yield f"  {name:24} {result['msgs_per_s'] / ceiling['msgs_per_s']:5.2f}  (target none)"


def run_line(result: Mapping[str, Any]) -> str:
    return (f"  {result['row']:24} {result['msgs_per_s']:>10,.0f} msgs/s  "
            f"{result['seconds']:6.2f} s  CPU {result['cpu_s']:6.2f} s "
            f"({result['cpu_s_per_million']:5.2f} s/1M, loop thread "
            f"{result['loop_cpu_s_per_million']:5.2f})  peak RSS {result['peak_rss_mib']:4.0f} MiB"
            f"  commit ms {commit_ms(result)}")


def commit_ms(result: Mapping[str, Any]) -> str:
    """Median / p99 / max commit milliseconds, or a dash for a row that commits nothing."""
    if not result["commits"]:
        return f"{'-':>17}"
    return (f"{result['commit_ms_p50']:5.1f} /{result['commit_ms_p99']:5.1f} /"
            f"{result['commit_ms_max']:5.1f}")


def table_lines(best: Mapping[str, dict[str, Any]]) -> Iterator[str]:
    yield (f"  {'row':24} {'msgs/s':>10}  {'CPU s/1M':>8}  {'loop s/1M':>9}  "
           f"{'peak RSS MiB':>12}  {'commit ms p50/p99/max':>21}  {'commits':>7}")
    for name, result in best.items():
        yield (f"  {name:24} {result['msgs_per_s']:>10,.0f}  {result['cpu_s_per_million']:>8.2f}"
               f"  {result['loop_cpu_s_per_million']:>9.2f}  {result['peak_rss_mib']:>12.0f}"
               f"  {commit_ms(result):>21}  {result['commits']:>7}")


def header_lines(args: argparse.Namespace, rows: Sequence[Row]) -> Iterator[str]:
    spec = importlib.util.find_spec("kasper_py")
    yield (f"input: {args.messages:,} messages of {args.size} bytes on {args.partitions} "
           f"partitions; {args.rounds} round(s) of {len(rows)} rows")
    yield f"kasper_py: {spec.origin if spec else 'not found'}"
    yield (f"confluent-kafka {confluent_kafka.version()[0]}, "
           f"librdkafka {confluent_kafka.libversion()[0]}; {os.cpu_count()} CPUs, "
           f"load average {os.getloadavg()[0]:.2f}")
    yield f"deep: {DEEP}"
    yield f"librdkafka defaults (kasper's librdkafka rows): {LIBRDKAFKA_DEFAULTS}"


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0], messages=1_000_000, partitions=4, rounds=1,
                       batch_size=None)
    parser.add_argument("--size", type=int, default=100, help="bytes per message value")
    parser.add_argument("--batch-sizes", default="1000,10000",
                        type=lambda text: [int(size) for size in text.split(",")])
    parser.add_argument("--only", type=lambda text: text.split(","),
                        help="comma list of row names to run, e.g. kasper-deep-10000")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the row a child process runs
    args = parser.parse_args()
    if set(DEEP) != set(LIBRDKAFKA_DEFAULTS):
        parser.error("DEEP and LIBRDKAFKA_DEFAULTS must name the same keys")
    if args.only:
        known = [row.name for row in planned_rows(args.batch_sizes)]
        unknown = [name for name in args.only if name not in known]
        if unknown:
            parser.error(f"unknown rows {unknown}; rows are: {', '.join(known)}")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    rows = [row for row in planned_rows(args.batch_sizes)
            if not args.only or row.name in args.only]
    for line in header_lines(args, rows):
        print(line, flush=True)
    source = f"bench-in-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions, payloads(args.messages, args.size))
    expected_library = getattr(importlib.util.find_spec("kasper_py"), "origin", None)
    results: dict[str, list[dict[str, Any]]] = {row.name: [] for row in rows}
    try:
        for _ in range(args.rounds):
            for row in rows:
                result = run_child(row, args, source)
                results[row.name].append(result)
                print(run_line(result), flush=True)
                if result["library"] not in (None, expected_library):
                    print(f"  ! {row.name} imported kasper_py from {result['library']}")
    finally:
        delete_topics(args.bootstrap, [source])
    best = {name: max(runs, key=lambda r: r["msgs_per_s"]) for name, runs in results.items()}
    print(f"best of {args.rounds} round(s):")
    for line in (*table_lines(best), *ratio_lines(best, args.batch_sizes)):
        print(line)


if __name__ == "__main__":
    main()
