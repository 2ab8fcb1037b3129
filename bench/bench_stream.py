"""Live on Spark: the same preloaded input through the live loop (1 process), through
``kasper_py.stream`` on local[2], and on a 2-worker standalone cluster, in one run.

Each row runs in its own child process with benchkit's Passthrough (every message to
an output topic, same partition; a fresh group, output topic and, for Spark, a fresh
checkpoint starting at ``earliest``). Catch-up: the live loop from the start until
caught up; a stream is timed from ``stream()`` to every end offset committed
(``caught_up``), its session start-up separately, with ``--max-per-trigger``
(maxOffsetsPerTrigger) messages a micro-batch at most. Micro-batch latency: p50/p99 of
``MicroBatch.seconds`` (the loop: of its turns). Where the time goes, summed over the
catch-up's micro-batches: Spark's trigger (``triggerExecution`` of the progress events)
against our ``foreachBatch`` (``addBatch``), and inside it the turn engine's time in
the tasks (``MicroBatch.task_seconds``, summed over partitions) against the
micro-batch's wall time. Paced: then a fresh topic fed ``--rate`` msgs/s for
``--seconds`` (bench_latency.py's producer), with end-to-end latency (input create
time to output log-append time) and the batch durations of that phase.

The cluster is ``kasper_py.stack.spark_master_url()``'s when it runs, else a master
and two workers started here in a temporary stack directory on free ports, stopped at
the end. A benchmark, not a test: it asserts nothing.

    python bench/bench_stream.py
    python bench/bench_stream.py --messages 300000 --seconds 10 --rows live,local
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog
from bench_latency import latencies, percentiles, wait_for_output
from benchkit import Passthrough, arguments, create_topics, delete_topics, fill, payloads

from kasper_py import Config, TopicProcessor
from kasper_py.observability.observe import NoopObserver, TurnStats

ROWS = ("live", "local", "cluster")
BENCH = Path(__file__).resolve().parent


# -- the child: one row ----------------------------------------------------------------


class Turns(NoopObserver):
    """Keeps each turn's seconds (its steps summed) and counts the messages."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.messages = 0

    def on_turn(self, stats: TurnStats) -> None:
        self.seconds.append(sum(stats.durations.values()))
        self.messages += len(stats.batch)


def config(args: argparse.Namespace, source: str) -> Config:
    return Config(name=f"bench-stream-{uuid.uuid4().hex[:8]}", bootstrap_servers=args.bootstrap,
                  input_topics=[source], batch_size=args.batch_size, batch_wait=0.2)


def live(args: argparse.Namespace) -> dict[str, Any]:
    """The loop over the preloaded input until caught up, then on the paced topic."""
    turns = Turns()
    processor = TopicProcessor(config(args, args.source), lambda _c: Passthrough(args.output),
                               observer=turns)
    started = time.perf_counter()
    processor.run_loop(until_caught_up=True)
    result = {"seconds": time.perf_counter() - started, "batches": turns.seconds}
    processor.close()
    with paced_topics(args) as (source, output):
        paced = Turns()
        processor = TopicProcessor(config(args, source), lambda _c: Passthrough(output),
                                   observer=paced)
        loop = threading.Thread(target=processor.run_loop)
        loop.start()
        try:
            result["paced"] = pace(args, source, output)
        finally:
            processor.close()
            loop.join()
        result["paced"]["batches"] = paced.seconds
    return result


def streamed(args: argparse.Namespace) -> dict[str, Any]:
    """Session start-up, the stream over the preloaded input until caught up, then a
    second query of the same session on the paced topic."""
    from kasper_py.spark.session import ship_modules, spark_session
    from kasper_py.stream import stream
    from kasper_py.stream._query import STREAM_SPARK_CONF

    started = time.perf_counter()
    spark = spark_session(args.master, conf={**STREAM_SPARK_CONF,
                                             "spark.ui.showConsoleProgress": "false"})
    ship_modules(spark, ["benchkit:Passthrough"], str(BENCH))
    result: dict[str, Any] = {"session_seconds": time.perf_counter() - started}
    cap = {"maxOffsetsPerTrigger": str(args.max_per_trigger)} if args.max_per_trigger else {}
    try:
        with tempfile.TemporaryDirectory() as checkpoint:
            began = time.perf_counter()
            run = stream(config(args, args.source), lambda _c: Passthrough(args.output),
                         checkpoint=checkpoint, spark=spark, trigger=args.trigger,
                         starting="earliest", kafka_options=cap)
            try:
                run.await_caught_up(timeout=3600)
                result["seconds"] = time.perf_counter() - began
                result.update(batch_figures(run))
                result["spark"] = spark_times(run.query.recentProgress)
            finally:
                run.stop()
        with paced_topics(args) as (source, output), \
                tempfile.TemporaryDirectory() as checkpoint:
            run = stream(config(args, source), lambda _c: Passthrough(output),
                         checkpoint=checkpoint, spark=spark, trigger=args.trigger,
                         starting="earliest")
            try:
                result["paced"] = pace(args, source, output)
                result["paced"].update(batch_figures(run))
            finally:
                run.stop()
    finally:
        spark.stop()
    return result


def batch_figures(run: Any) -> dict[str, Any]:
    """The micro-batches that read something: their seconds, messages and task time."""
    done = [b for b in run.batches if b.messages]
    return {"batches": [b.seconds for b in done], "batch_messages": [b.messages for b in done],
            "task_seconds": sum(b.task_seconds for b in done)}


def spark_times(progress: Sequence[Any]) -> dict[str, float]:
    """Seconds per phase of Spark's own micro-batch timing (``durationMs``), summed over
    the progress events that read rows (Spark keeps the last 100)."""
    totals: dict[str, float] = {}
    for event in progress:
        if event["numInputRows"]:
            for phase, millis in event["durationMs"].items():
                totals[phase] = totals.get(phase, 0.0) + millis / 1000
    return totals


@contextlib.contextmanager
def paced_topics(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    source, output = f"bench-paced-in-{suffix}", f"bench-paced-out-{suffix}"
    create_topics(args.bootstrap, [source], args.partitions)
    create_topics(args.bootstrap, [output], args.partitions,
                  **{"message.timestamp.type": "LogAppendTime"})
    try:
        yield source, output
    finally:
        delete_topics(args.bootstrap, [source, output])


def pace(args: argparse.Namespace, source: str, output: str) -> dict[str, Any]:
    """Feed ``source`` at ``--rate`` for ``--seconds`` (bench_latency.py's producer); once
    ``output`` holds every message, its end-to-end latency."""
    time.sleep(2.0)  # the first fetch (the loop) or micro-batch (a stream) is under way
    command = [sys.executable, str(BENCH / "bench_latency.py"), "--role", "producer",
               "--bootstrap", args.bootstrap, "--source", source, "--rate", str(args.rate),
               "--seconds", str(args.seconds), "--partitions", str(args.partitions),
               "--size", str(args.size)]
    sent = json.loads(subprocess.run(command, check=True, capture_output=True, text=True)
                      .stdout.strip().splitlines()[-1])["sent"]
    wait_for_output(args.bootstrap, output, args.partitions, sent, timeout=120)
    return {"sent": sent, **percentiles(latencies(args.bootstrap, output, args.partitions,
                                                  sent))}


def child(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = live(args) if args.child == "live" else streamed(args)
    print(json.dumps(result))


# -- the parent: input, cluster, rows, report --------------------------------------------


def run_child(kind: str, args: argparse.Namespace, source: str, master: str) -> dict[str, Any]:
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [output], args.partitions)
    cmd = [sys.executable, __file__, "--child", kind, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages),
           "--partitions", str(args.partitions), "--batch-size", str(args.batch_size),
           "--trigger", str(args.trigger), "--max-per-trigger", str(args.max_per_trigger),
           "--rate", str(args.rate), "--seconds", str(args.seconds), "--size", str(args.size),
           "--master", master]
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{kind} failed:\n{exc.stderr[-3000:]}")
    finally:
        delete_topics(args.bootstrap, [output])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def spark_cluster() -> Iterator[str]:
    """The stack's master URL when its cluster runs, else a private one on free ports."""
    from kasper_py import stack
    from kasper_py.stack import _lifecycle
    from kasper_py.stack._components import GROUPS, SparkMaster
    from kasper_py.stack._settings import Settings, with_free_spark_ports

    if os.environ.get("KASPER_SPARK_MASTER") or all(
            s.running for s in stack.status() if s.name.startswith("spark-")):
        yield stack.spark_master_url()
        return
    with tempfile.TemporaryDirectory(prefix="bench-spark-stack-") as stack_dir:
        settings = with_free_spark_ports(Settings.load(stack_dir))
        try:
            _lifecycle.up(GROUPS["spark"], settings, report=print)
            yield SparkMaster(settings).address
        finally:
            _lifecycle.down(GROUPS["spark"], settings, purge=False, report=print)


def ms(seconds: Sequence[float], q: float) -> str:
    if not seconds:
        return "-"
    ordered = sorted(seconds)
    value = statistics.median(ordered) if q == 0.5 else ordered[min(len(ordered) - 1,
                                                                    int(len(ordered) * q))]
    return f"{value * 1000:,.0f}"


def table_lines(results: dict[str, dict[str, Any]], messages: int) -> Iterator[str]:
    yield ("| row | msgs/s (catch-up) | with start-up | batches | batch ms p50 / p99 "
           "| paced: batch ms p50 / p99 | paced: e2e ms p50 / p99 |")
    yield "|---|---|---|---|---|---|---|"
    for kind, r in results.items():
        startup = r.get("session_seconds", 0.0)
        with_startup = f"{messages / (r['seconds'] + startup):,.0f}" if startup else "-"
        paced = r["paced"]
        yield (f"| {kind} | {messages / r['seconds']:,.0f} | {with_startup} "
               f"| {len(r['batches'])} | {ms(r['batches'], 0.5)} / {ms(r['batches'], 0.99)} "
               f"| {ms(paced['batches'], 0.5)} / {ms(paced['batches'], 0.99)} "
               f"| {paced['p50_ms']:,.0f} / {paced['p99_ms']:,.0f} |")


def where_lines(kind: str, r: dict[str, Any], partitions: int) -> Iterator[str]:
    """Where a stream's catch-up time went."""
    spark, wall = r["spark"], sum(r["batches"])
    trigger, add = spark.get("triggerExecution", 0.0), spark.get("addBatch", 0.0)
    yield (f"  {kind}: session start-up {r['session_seconds']:.1f} s; stream() to caught "
           f"up {r['seconds']:.1f} s, of which Spark's micro-batches {trigger:.1f} s "
           f"(foreachBatch {add:.1f} s; offsets, planning and WAL "
           + ", ".join(f"{k} {v:.1f}" for k, v in sorted(spark.items())
                       if k not in ("triggerExecution", "addBatch") and v >= 0.05)
           + f"); our micro-batch wall {wall:.1f} s, turn engine in the tasks "
           f"{r['task_seconds']:.1f} task-s over {partitions} partitions "
           f"({r['task_seconds'] / max(wall, 1e-9) / 2:.0%} of 2 slots' wall); "
           f"messages a batch p50 {statistics.median(r['batch_messages'] or [0]):,.0f}")


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0], messages=3_000_000, partitions=4, rounds=1)
    parser.add_argument("--size", type=int, default=100, help="bytes per message value")
    parser.add_argument("--trigger", type=float, default=1.0, help="stream trigger, seconds")
    parser.add_argument("--max-per-trigger", type=int, default=500_000,
                        help="maxOffsetsPerTrigger of the catch-up (0: no cap, one batch)")
    parser.add_argument("--rate", type=int, default=10_000, help="paced msgs/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="paced phase, seconds")
    parser.add_argument("--rows", default=",".join(ROWS), type=lambda t: t.split(","),
                        help="comma list of rows: live, local, cluster")
    for internal in ("--child", "--master"):  # set for the child processes
        parser.add_argument(internal, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    source = f"bench-in-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions, payloads(args.messages, args.size, keyed=True))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; input "
          f"{args.messages:,} messages of {args.size} bytes on {args.partitions} partitions, "
          f"batch_size {args.batch_size:,}, trigger {args.trigger:g} s, maxOffsetsPerTrigger "
          f"{args.max_per_trigger or 'none'}; paced {args.rate:,} msgs/s for {args.seconds:g} s",
          flush=True)
    results: dict[str, dict[str, Any]] = {}
    try:
        with spark_cluster() if "cluster" in args.rows else contextlib.nullcontext("") as url:
            masters = {"live": "", "local": "local[2]", "cluster": url}
            for kind in args.rows:
                results[kind] = run_child(kind, args, source, masters[kind])
                print(f"  {kind:8} {args.messages / results[kind]['seconds']:>10,.0f} msgs/s "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        delete_topics(args.bootstrap, [source])
    print("\n".join(table_lines(results, args.messages)))
    print("where a stream's catch-up time goes:")
    for kind in (k for k in results if k != "live"):
        print("\n".join(where_lines(kind, results[kind], args.partitions)))
    print(f"load average after the run {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
