"""End-to-end latency of a paced input through TopicProcessor: with the defaults (row
``default``: a 50 ms latency target, batches sized by the loop), with Kasper's classic
fixed batches (``max_latency=None``, batch_size 1,000: row ``classic``), on request
with ``--max-latency`` (row ``max_latency``), and the baseline, row ``handwritten``: the
same passthrough written by hand with confluent-kafka and tuned for latency, at-least-
once as the loop is (a turn takes what the consumer holds as soon as one record is in,
produces it with no linger, waits for every ack, commits offset+1 synchronously; both
clients TCP_NODELAY). Its p99 is what this machine and broker allow, and every row's
p99 is printed as a ratio to it. What the defaults do through a backlog, against the
best-tuned batches, is bench_defaults.py's.

Latency rows: a producer in its own process writes ``--rates`` messages per second
(100-byte values, dealt round-robin over the partitions, TCP_NODELAY as Java producers
have it unless ``--nagle``) for ``--seconds``; a passthrough loop in another process
(started first, reading from the start of the empty topic) copies every message to an
output topic. Both topics are created with ``message.timestamp.type=LogAppendTime``. A
message's latency is its output's log-append time minus its create time (written, in
microseconds, at the start of the value: one host, one clock); the loop's share is its
output's log-append time minus its input's (the passthrough keeps each partition's
order, so the i-th output of a partition is its i-th input), the producer's share the
rest (create time to the input's log-append time). Each row reports p50, p99 and max
over every message, the p99 of those created after the first second, the loop's and
the producer's shares' p50 and p99, the paced producer's own delivery latencies
(produce() to its ack, librdkafka's ``latency()``), the CPU seconds (user + system,
every thread; the loop thread's in brackets) the loop process used from its start to
its stop, and the load average as the row ended. ``--per-second`` prints each second's
p99s too, ``--trace`` writes each turn and each garbage collection of the kasper_py
loop, ``--profile`` a cProfile of it, ``--before DIR`` runs every kasper_py row again,
right after, on the kasper_py in DIR. The settings turn round from round to round, so
no row always runs first. The loop is stopped once every message is in the output. A
benchmark, not a test: the target (p99 <= 20 ms at 1,000 and 10,000 msg/s with the
defaults) is printed beside the figures, and each row's p99 as a ratio to it and to the
hand-written row's, never asserted.

    python bench/bench_latency.py
    python bench/bench_latency.py --seconds 10 --rates 10000 --settings default
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bench_passthrough import (
    FirstDeliveryError,
    cpu_seconds,
    produce_all,
    raw_producer,
    topic_partitions,
    wait_for_acks,
)
from benchkit import Passthrough, arguments, child_env, create_topics, delete_topics
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

STAMP = 16
"""Leading bytes of a value holding its create time in microseconds, zero-padded."""
LOOP_READY = "loop-ready"


HANDWRITTEN = "handwritten"
"""The row of the hand-written loop (no kasper_py in it): the baseline of the others."""


def settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Config keyword arguments of each kasper_py latency setting, by its row name."""
    return {"classic": {"max_latency": None}, "default": {},
            "max_latency": {"max_latency": args.max_latency}}


# -- the child processes ----------------------------------------------------------------


def producer_child(args: argparse.Namespace) -> None:
    """Write ``args.rate`` messages a second for ``args.seconds``; print how many, and the
    p50 and p99 of their delivery latencies. The producer is warmed up first (the
    topic's leader looked up and connected to) as a long-running producer is, and paces
    in 1 ms ticks: each tick produces what is due, stamped with the tick's time (a
    0.5 ms tick took a fifth more CPU for the same requests, on a machine where the
    producer's CPU is taken from the broker and the loop)."""
    delivered: list[float] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            sys.exit(f"the paced producer's delivery failed: {error}")
        delivered.append(message.latency())

    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 1,
                         "socket.nagle.disable": args.nodelay,
                         "queue.buffering.max.messages": 1_000_000,
                         "on_delivery": on_delivery})
    producer.list_topics(args.source, 30)
    padding = b"x" * (args.size - STAMP)
    started = time.time()
    sent = 0
    while (now := time.time()) - started < args.seconds:
        due = int((now - started) * args.rate)
        value = b"%0*d" % (STAMP, int(now * 1e6)) + padding
        millis = int(now * 1000)
        while sent < due:
            try:
                producer.produce(args.source, value, partition=sent % args.partitions,
                                 timestamp=millis)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    if producer.flush(60):
        sys.exit("the paced producer's messages were not all acknowledged")
    delivered.sort()
    print(json.dumps({"sent": sent, "seconds": time.time() - started,
                      "delivery_p50_ms": statistics.median(delivered) * 1000,
                      "delivery_p99_ms": _p99(delivered) * 1000}))


def loop_child(args: argparse.Namespace) -> None:
    """A passthrough TopicProcessor until SIGTERM; print its CPU seconds and turns."""
    import structlog

    from kasper_py import Config, TopicProcessor
    from kasper_py.observability.observe import NoopObserver, TurnStats

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Turns(NoopObserver):
        def __init__(self) -> None:
            self.turns, self.messages = 0, 0
            self.trace = open(args.trace, "a") if args.trace else None  # noqa: SIM115

        def on_start(self, assigned: list[tuple[str, int]]) -> None:
            if self.trace is not None:
                gc.callbacks.append(self.collected)
            print(LOOP_READY, flush=True)

        def collected(self, phase: str, info: dict[str, int]) -> None:
            """Each garbage collection's pause, in the trace (``gc`` lines)."""
            if phase == "start":
                self.gc_started = time.perf_counter()
            elif self.trace is not None:
                self.trace.write(json.dumps({
                    "setting": args.setting, "at": time.time(), "gc": info["generation"],
                    "ms": round((time.perf_counter() - self.gc_started) * 1000, 3),
                    "collected": info["collected"]}) + "\n")

        def on_turn(self, stats: TurnStats) -> None:
            self.turns += 1
            self.messages += len(stats.batch)
            if self.trace is not None:
                self.trace.write(json.dumps({
                    "setting": args.setting, "at": time.time(), "batch": len(stats.batch),
                    "target": stats.batch_size_target,
                    **{step: round(s * 1000, 3) for step, s in stats.durations.items()}})
                    + "\n")

    config = Config(name=f"bench-latency-{uuid.uuid4().hex[:8]}",
                    bootstrap_servers=args.bootstrap, input_topics=[args.source],
                    **settings(args)[args.setting])
    observer = Turns()
    cpu_before, loop_before = cpu_seconds(), time.thread_time()
    processor = TopicProcessor(config, lambda _c: Passthrough(args.output), observer=observer)
    if args.profile:
        import cProfile

        cProfile.runctx("processor.run_until_stopped()", globals(), locals(), args.profile)
    else:
        processor.run_until_stopped()
    print(json.dumps({"cpu_s": cpu_seconds() - cpu_before, "turns": observer.turns,
                      "loop_thread_s": time.thread_time() - loop_before,
                      "messages": observer.messages}), flush=True)


def handwritten_child(args: argparse.Namespace) -> None:
    """The baseline: the passthrough written by hand with confluent-kafka, tuned for
    latency, until SIGTERM; print its CPU seconds and turns. At-least-once as the loop
    is: each turn produces its batch, waits for every ack (``flush``), then commits
    offset+1 per partition synchronously. No linger anywhere: a turn takes what the
    consumer holds as soon as one record is in (``poll``, then ``consume`` with no
    wait), the producer sends at once (``linger.ms=0``; ``flush`` would not wait for it
    anyway), both clients set TCP_NODELAY; a fresh group, reading from the start."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    cpu_before, loop_before = cpu_seconds(), time.thread_time()
    consumer = Consumer({"bootstrap.servers": args.bootstrap,
                         "group.id": f"bench-latency-hand-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "socket.nagle.disable": True})
    consumer.assign([TopicPartition(args.source, p, OFFSET_BEGINNING)
                     for p in range(args.partitions)])
    failed = FirstDeliveryError()
    producer = raw_producer(args, failed, **{"linger.ms": 0, "socket.nagle.disable": True})
    print(LOOP_READY, flush=True)
    turns = messages = 0
    while not stopping:
        first = consumer.poll(0.1)
        if first is None:
            continue
        batch = [first, *consumer.consume(100_000, 0)]
        offsets = produce_all(producer, args.output, batch)
        wait_for_acks(producer, failed)
        consumer.commit(offsets=topic_partitions(offsets), asynchronous=False)
        turns, messages = turns + 1, messages + len(batch)
    consumer.close()
    print(json.dumps({"cpu_s": cpu_seconds() - cpu_before, "turns": turns,
                      "loop_thread_s": time.thread_time() - loop_before,
                      "messages": messages}), flush=True)


# -- one latency row ----------------------------------------------------------------------


def child_command(args: argparse.Namespace, role: str, **more: Any) -> list[str]:
    command = [sys.executable, __file__, "--role", role, "--bootstrap", args.bootstrap,
               "--partitions", str(args.partitions), "--size", str(args.size),
               "--max-latency", str(args.max_latency), *([] if args.nodelay else ["--nagle"])]
    if args.trace:
        command += ["--trace", args.trace]
    if args.profile:
        command += ["--profile", args.profile]
    for key, value in more.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return command


def latency_row(args: argparse.Namespace, setting: str, rate: int,
                before: str | None = None) -> dict[str, Any]:
    """Run one setting at one rate on fresh topics (the loop on the kasper_py in
    ``before`` when given); its latency figures and CPU."""
    suffix = uuid.uuid4().hex[:8]
    source, output = f"bench-lat-in-{suffix}", f"bench-lat-out-{suffix}"
    create_topics(args.bootstrap, [source, output], args.partitions,
                  **{"message.timestamp.type": "LogAppendTime"})
    role = HANDWRITTEN if setting == HANDWRITTEN else "loop"
    loop = subprocess.Popen(child_command(args, role, setting=setting, source=source,
                                          output=output),
                            stdout=subprocess.PIPE, text=True, env=child_env(before))
    try:
        wait_for_line(loop, LOOP_READY)
        time.sleep(1.0)  # the consumer's first fetch is under way
        produced = json.loads(subprocess.run(
            child_command(args, "producer", source=source, rate=rate, seconds=args.seconds),
            check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        wait_for_output(args.bootstrap, output, args.partitions, produced["sent"])
        loop.send_signal(signal.SIGTERM)
        stdout, _ = loop.communicate(timeout=60)
        used = json.loads(stdout.strip().splitlines()[-1])
        millis = latencies(args.bootstrap, source, output, args.partitions, produced["sent"])
    finally:
        if loop.poll() is None:
            loop.kill()
        delete_topics(args.bootstrap, [source, output])
    return {"setting": setting + ("@before" if before else ""), "rate": rate,
            "sent": produced["sent"],
            "achieved_rate": produced["sent"] / produced["seconds"], **percentiles(millis),
            "cpu_s": used["cpu_s"], "loop_thread_s": used["loop_thread_s"],
            "turns": used["turns"], "delivery_p50_ms": produced["delivery_p50_ms"],
            "delivery_p99_ms": produced["delivery_p99_ms"],
            "load": os.getloadavg()[0], "per_second": per_second(millis)}


def wait_for_line(process: subprocess.Popen[str], wanted: str) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == wanted:
            return
    sys.exit(f"the loop process exited ({process.wait()}) before it started")


def wait_for_output(bootstrap: str, topic: str, partitions: int, count: int,
                    timeout: float = 120.0) -> None:
    """Until ``topic`` holds ``count`` messages (the loop copied every input)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency-watch"})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            total = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
                        for p in range(partitions))
            if total >= count:
                return
            time.sleep(0.2)
    finally:
        consumer.close()
    sys.exit(f"{topic} holds fewer than {count} messages after {timeout} s")


def latencies(bootstrap: str, source: str, output: str, partitions: int, count: int
              ) -> list[tuple[float, float, float]]:
    """(create time, milliseconds from it to its output's log-append time, milliseconds
    from its input's log-append time to its output's) of each input (its create time in
    its value), in milliseconds: the last is the loop's share, the rest the paced
    producer's (the passthrough keeps each partition's order, so the i-th output of a
    partition is its i-th input)."""
    inputs, outputs = (read_all(bootstrap, topic, partitions, count) for topic in (source, output))
    timed = []
    for partition, written in outputs.items():
        for (_, appended), (value, copied) in zip(inputs[partition], written, strict=True):
            created = int(value[:STAMP]) / 1000
            timed.append((created, copied - created, copied - appended))
    return timed


def read_all(bootstrap: str, topic: str, partitions: int, count: int
             ) -> dict[int, list[tuple[bytes, int]]]:
    """Every (value, timestamp) of ``topic``'s ``count`` messages, by partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency-read",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    read: dict[int, list[tuple[bytes, int]]] = {p: [] for p in range(partitions)}
    try:
        while sum(map(len, read.values())) < count:
            for record in consumer.consume(10_000, 5.0):
                if record.error() is not None:
                    sys.exit(f"reading {topic} failed: {record.error().str()}")
                read[record.partition()].append((record.value(), record.timestamp()[1]))
    finally:
        consumer.close()
    return read


WARM_UP_MS = 1000
"""The steady p99 leaves out inputs created in the run's first second: the loop's first
fetch (offsets looked up, a fetch session opened) lands there, once per process."""


def percentiles(timed: Sequence[tuple[float, float, float]]) -> dict[str, float]:
    """p50, p99 and max over every input, p99 over those created after the first
    ``WARM_UP_MS`` (``steady_p99_ms``), the p50 and p99 of the loop's share alone (input
    log-append time to output log-append time) and of the paced producer's (create time
    to input log-append time)."""
    ordered = sorted(millis for _, millis, _ in timed)
    start = min(created for created, _, _ in timed)
    steady = sorted(millis for created, millis, _ in timed if created >= start + WARM_UP_MS)
    loop = sorted(millis for _, _, millis in timed)
    producer = sorted(millis - loop_share for _, millis, loop_share in timed)
    return {"p50_ms": statistics.median(ordered), "p99_ms": _p99(ordered),
            "max_ms": ordered[-1], "steady_p99_ms": _p99(steady or ordered),
            "loop_p50_ms": statistics.median(loop), "loop_p99_ms": _p99(loop),
            "producer_p50_ms": statistics.median(producer), "producer_p99_ms": _p99(producer)}


def per_second(timed: Sequence[tuple[float, float, float]]) -> list[tuple[float, ...]]:
    """Each second of the run (by create time): its p99 end to end, of the loop's share
    and of the paced producer's, in milliseconds: a tail spread over the run, or one
    bad second."""
    start = min(created for created, _, _ in timed)
    seconds: dict[int, list[tuple[float, float, float]]] = {}
    for created, millis, loop_share in timed:
        seconds.setdefault(int((created - start) // 1000), []).append(
            (millis, loop_share, millis - loop_share))
    return [tuple(_p99(sorted(column)) for column in zip(*seconds[second], strict=True))
            for second in sorted(seconds)]


def _p99(ordered: Sequence[float]) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# -- the report -----------------------------------------------------------------------


TARGET_P99_MS = 20.0
"""The defaults' p99 target at 1,000 and 10,000 msg/s: each row's ratio is its p99 to it."""


def table_lines(rows: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """The rows, each with its p99 as a ratio to the target and to the median p99 of the
    hand-written rows at its rate (among ``rows``; ``-`` until one ran)."""
    yield (f"  {'setting':12} {'rate msg/s':>10} {'achieved':>9} {'p50 ms':>8} {'p99 ms':>8}"
           f" {'max ms':>8} {'CPU s (loop)':>13} {'turns':>7} {'p99 / 20 ms':>11}"
           f" {'p99 / hand':>10} {'p99 after 1 s':>13} {'loop p50/p99':>13}"
           f" {'prod p50/p99':>13} {'acks p50/p99':>13} {'load':>5}")
    for row in rows:
        hand = [r["p99_ms"] for r in rows
                if r["setting"] == HANDWRITTEN and r["rate"] == row["rate"]]
        to_hand = f"{row['p99_ms'] / statistics.median(hand):.2f}" if hand else "-"
        yield (f"  {row['setting']:12} {row['rate']:>10,} {row['achieved_rate']:>9,.0f}"
               f" {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} {row['max_ms']:>8.1f}"
               f" {row['cpu_s']:>6.2f} ({row['loop_thread_s']:4.2f}) {row['turns']:>7,}"
               f" {row['p99_ms'] / TARGET_P99_MS:>11.2f} {to_hand:>10}"
               f" {row['steady_p99_ms']:>13.1f}"
               f" {row['loop_p50_ms']:>6.1f}/{row['loop_p99_ms']:<6.1f}"
               f" {row['producer_p50_ms']:>6.1f}/{row['producer_p99_ms']:<6.1f}"
               f" {row['delivery_p50_ms']:>6.1f}/{row['delivery_p99_ms']:<6.1f}"
               f" {row['load']:>5.2f}")


def per_second_line(row: Mapping[str, Any]) -> str:
    """The row's p99 of each second, end to end (loop's share, producer's share)."""
    return "    p99 each second, ms: " + ", ".join(
        f"{total:.0f} ({loop:.0f}, {producer:.0f})" for total, loop, producer in row["per_second"])


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__.splitlines()[0], messages=1_000_000, partitions=4, rounds=1,
                       batch_size=None)
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long the paced producer writes, per row")
    parser.add_argument("--rates", default="1000,10000",
                        type=lambda text: [int(rate) for rate in text.split(",")],
                        help="comma list of messages per second")
    parser.add_argument("--max-latency", type=float, default=0.05,
                        help="Config.max_latency of the max_latency rows, seconds")
    parser.add_argument("--settings", default=f"default,classic,{HANDWRITTEN}",
                        type=lambda text: text.split(","),
                        help="latency rows to run: default, classic, max_latency, "
                             f"{HANDWRITTEN} (the baseline; never run --before)")
    parser.add_argument("--size", type=int, default=100, help="bytes per message value")
    parser.add_argument("--trace", metavar="FILE",
                        help="append every turn of the latency rows to FILE as a JSON line: "
                             "its batch, batch size target and step milliseconds")
    parser.add_argument("--before", metavar="DIR",
                        help="run every row a second time, right after, with the loop on "
                             "the kasper_py in DIR (say a git archive of an older commit)")
    parser.add_argument("--nagle", dest="nodelay", action="store_false",
                        help="the paced producer keeps Nagle's algorithm (librdkafka's "
                             "default; without this it sets TCP_NODELAY as Java clients do)")
    parser.add_argument("--per-second", action="store_true",
                        help="print each row's p99 of every second of its run: end to end "
                             "(the loop's share, the paced producer's)")
    parser.add_argument("--profile", metavar="FILE",
                        help="write a cProfile of the loop process to FILE (the last row's)")
    for internal in ("--role", "--setting", "--rate"):  # set for the child processes
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size <= STAMP:
        parser.error(f"--size must be over {STAMP} bytes (the create time is in the value)")
    return args


def main() -> None:
    args = parse_args()
    if args.role == "producer":
        args.rate = int(args.rate)
        producer_child(args)
        return
    if args.role == "loop":
        loop_child(args)
        return
    if args.role == HANDWRITTEN:
        handwritten_child(args)
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
          f"{args.partitions} partitions, {args.size}-byte values, {args.seconds:g} s a row; "
          f"max_latency rows: max_latency={args.max_latency}", flush=True)
    rows = []
    trees = [None, args.before] if args.before else [None]
    for round_ in range(args.rounds):
        # the settings turn round from round to round, as a row's two trees swap order:
        # no row always runs first
        turned = args.settings[round_ % len(args.settings):] + args.settings[
            :round_ % len(args.settings)]
        for pair, (rate, setting) in enumerate(itertools.product(args.rates, turned)):
            for before in trees[::-1] if (round_ + pair) % 2 else trees:
                if before is None or setting != HANDWRITTEN:
                    rows.append(latency_row(args, setting, rate, before))
                    print(list(table_lines(rows))[-1], flush=True)
                    if args.per_second:
                        print(per_second_line(rows[-1]), flush=True)
    print("end-to-end latency (input create time to output log-append time):")
    print("\n".join(table_lines(rows)))
    print(f"  target: p99 <= {TARGET_P99_MS:g} ms at 1,000 and 10,000 msg/s with the defaults "
          "(a ratio <= 1.00)")
    print(f"load average after the run {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
