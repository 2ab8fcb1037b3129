"""Scaling out: ``kasper run --processes N`` with 1 and 2 worker processes, in one run,
on the same input (a passthrough and a RocksDB word count), and the pause a rebalance
causes in group mode. A benchmark, never a test: figures are printed, not asserted.

Throughput rows run ``kasper run ... --processes N --until-caught-up`` on a 4-partition
topic (static assignment: the supervisor splits the partitions evenly) and give three
rates: launch to exit (start-up and shut-down included), first batch to exit, and
first to last batch (the processing alone, from the workers' ``kasper.batch`` log lines:
the messages of the batches logged after the first, over the time between), with
the start-up (time to the first batch) and shut-down (exit after the last) apart. The
cores busy are sampled through each run: over the whole run, and between the first and
last batch, where the machine's cores over those one worker keeps busy (its own, its
client threads', the broker's) bound what two workers can reach on this machine.
Rebalance rows run worker A alone in group mode on a topic fed
continuously, then start worker B, and read their JSON logs: the time from B's launch
to its first batch (join to processing), and the longest gap between A's batches of the
partitions A kept (the retained partitions' pause; a gap of a few batch_waits means
none).

    python bench/bench_scaling.py --messages 2000000 --rounds 2
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from benchkit import arguments, create_topics, delete_topics, fill, payloads
from confluent_kafka import Producer

HERE = Path(__file__).parent
WORDS = [f"w{i}" for i in range(1000)]


def kasper(*args: str) -> list[str]:
    return [sys.executable, "-m", "kasper_py", "run", *args, "--app-dir", str(HERE),
            "--log-format", "json"]


def write_config(folder: Path, name: str, topic: str, batch_size: int, **more: str) -> str:
    lines = [f'name = "{name}"', f'input_topics = ["{topic}"]', f"batch_size = {batch_size}",
             "batch_wait = 0.2", f'state_dir = "{folder / "state"}"']
    lines += [f'{key} = "{value}"' for key, value in more.items()]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def log_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON log lines of ``text`` (workers share one stderr: a line that two of them
    garbled would be reported, not skipped)."""
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                print(f"  garbled log line: {line[:120]}", flush=True)


def seconds(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick


def broker_cpu_seconds() -> float | None:
    """CPU seconds the local stack's Kafka broker used so far (None: not the local one)."""
    pid_file = Path(__file__).parent.parent / ".kasper-stack" / "kafka" / "kafka.pid"
    try:
        pid = int(pid_file.read_text().split()[0])  # the pid, then its start time
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return None
    utime, stime = (int(v) for v in stat.rsplit(")", 1)[1].split()[11:13])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples the machine's and the broker's CPU seconds on entry, every 50 ms while a
    run goes on, and on exit, so the cores busy can be read for the whole run or any
    window of it (the processing alone)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        self.samples.append((time.time(), *machine_busy_seconds(), broker_cpu_seconds()))

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._take()

    def cores(self, start: float = 0.0, end: float = float("inf")
              ) -> tuple[float | None, float | None]:
        """(machine, broker) cores busy between ``start`` and ``end`` (epoch seconds;
        by default the whole run)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None, None
        (_, busy0, total0, broker0), (_, busy1, total1, broker1) = inside[0], inside[-1]
        cpus = os.cpu_count() or 1
        machine = (busy1 - busy0) / (total1 - total0) * cpus
        broker = (None if broker0 is None or broker1 is None
                  else (broker1 - broker0) / (inside[-1][0] - inside[0][0]))
        return machine, broker


def throughput_row(kind: str, workers: int, args: Any, folder: Path, source: str) -> dict[str, Any]:
    """One ``--processes N --until-caught-up`` run over the whole source topic."""
    name = f"scale-{kind}-{workers}-{uuid.uuid4().hex[:6]}"
    output = f"{name}-out"
    create_topics(args.bootstrap, [output], args.partitions)
    env = {**os.environ, "KASPER_BOOTSTRAP_SERVERS": args.bootstrap, "SCALING_OUTPUT": output}
    serdes = {"value_serde": "str"} if kind == "wordcount" else {}
    config = write_config(folder, name, source, args.batch_size, **serdes)
    target = (["scaling_app:word_count", "--stores", "scaling_app:tables"]
              if kind == "wordcount" else ["scaling_app:passthrough"])
    launched = time.time()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with CpuSampler() as sampler:
        done = subprocess.run([*kasper(*target, "--config", config, "--processes",
                                       str(workers), "--until-caught-up")],
                              env=env, capture_output=True, text=True, check=False)
    elapsed = time.time() - launched
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine, broker = sampler.cores()
    cpu = {"machine_cores": machine, "broker_cores": broker,
           "worker_cores": (children.ru_utime + children.ru_stime - children_before.ru_utime
                            - children_before.ru_stime) / elapsed}
    delete_topics(args.bootstrap, [output])
    if done.returncode != 0:
        raise SystemExit(f"{kind} x{workers} failed:\n{done.stderr[-3000:]}")
    batches = sorted((seconds(e), e["consumed"]) for e in log_events(done.stderr)
                     if e["event"] == "kasper.batch")
    first, last = batches[0][0] - launched, batches[-1][0] - launched
    after_first = sum(consumed for at, consumed in batches if at > batches[0][0])
    window_machine, window_broker = sampler.cores(batches[0][0], batches[-1][0])
    return {"row": f"{kind}-x{workers}", "msgs_per_s": args.messages / elapsed,
            "seconds": elapsed, "to_first_batch_s": first, "after_last_batch_s": elapsed - last,
            "steady_msgs_per_s": args.messages / max(elapsed - first, 1e-9),
            "processing_msgs_per_s": after_first / max(last - first, 1e-9),
            "window_machine_cores": window_machine, "window_broker_cores": window_broker, **cpu}


def cores(value: float | None) -> str:
    return "n/a (not the local stack's)" if value is None else f"{value:.2f}"


def feed(bootstrap: str, topic: str, partitions: int, stop: threading.Event) -> None:
    """Keep the topic fed: 100 messages every 10 ms per partition, until ``stop``."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    while not stop.is_set():
        for partition in range(partitions):
            for _ in range(100):
                producer.produce(topic, WORDS[n % len(WORDS)].encode(), partition=partition)
                n += 1
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)


def rebalance_row(args: Any, folder: Path) -> dict[str, Any]:
    """Worker A alone in group mode, then B joins: B's join-to-first-batch time and the
    longest gap in A's batches of the partitions A kept."""
    name = f"scale-rebalance-{uuid.uuid4().hex[:6]}"
    topic, output = f"{name}-in", f"{name}-out"
    create_topics(args.bootstrap, [topic, output], args.partitions)
    env = {**os.environ, "KASPER_BOOTSTRAP_SERVERS": args.bootstrap, "SCALING_OUTPUT": output}
    config = write_config(folder, name, topic, 1000, assignment="group")
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(args.bootstrap, topic, args.partitions, stop))
    feeder.start()
    logs = {w: folder / f"{name}-{w}.log" for w in "ab"}
    workers = {}
    try:
        with logs["a"].open("w") as out:
            workers["a"] = subprocess.Popen(kasper("scaling_app:passthrough", "--config", config),
                                            env=env, stderr=out, stdout=subprocess.DEVNULL)
        time.sleep(8)
        joined = time.time()
        with logs["b"].open("w") as out:
            workers["b"] = subprocess.Popen(kasper("scaling_app:passthrough", "--config", config),
                                            env=env, stderr=out, stdout=subprocess.DEVNULL)
        time.sleep(20)
    finally:
        for worker in workers.values():
            worker.terminate()
            worker.wait(60)
        stop.set()
        feeder.join()
        delete_topics(args.bootstrap, [topic, output])
    a = list(log_events(logs["a"].read_text()))
    b = list(log_events(logs["b"].read_text()))
    kept = {p for e in a if e["event"] == "kasper.partitions_assigned" for p in e["partitions"]}
    given_up = [e for e in a if e["event"] == "kasper.partitions_revoked" and seconds(e) > joined]
    if given_up:  # the rebalance B caused (later ones are A stopping)
        kept -= set(given_up[0]["partitions"])
        until = seconds(given_up[0]) + 10
    else:
        until = joined + 20
    b_batches = [seconds(e) for e in b if e["event"] == "kasper.batch"]
    kept_times = sorted(seconds(e) for e in a if e["event"] == "kasper.batch"
                        and e["partition"] in kept and joined - 2 < seconds(e) < until)
    gaps = [later - earlier for earlier, later in itertools.pairwise(kept_times)]
    return {"row": "rebalance", "join_to_first_batch_s": min(b_batches) - joined if b_batches
            else None, "kept_partitions": sorted(kept), "kept_max_gap_s": max(gaps, default=None),
            "kept_median_gap_s": sorted(gaps)[len(gaps) // 2] if gaps else None}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=2_000_000, partitions=4, rounds=1)
    args = parser.parse_args()
    print(f"{args.messages:,} messages, {args.partitions} partitions, batch {args.batch_size}, "
          f"{os.cpu_count()} cores, best of {args.rounds}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="kasper-scaling-"))
    source = f"scale-in-{uuid.uuid4().hex[:6]}"
    create_topics(args.bootstrap, [source], args.partitions)
    fill(args.bootstrap, source, args.partitions,
         [{**record, "value": WORDS[i % len(WORDS)].encode()}
          for i, record in enumerate(payloads(args.messages, 10))])
    best: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(args.rounds):
            for kind in ("passthrough", "wordcount"):
                for workers in (1, 2):
                    row = throughput_row(kind, workers, args, folder, source)
                    print(f"  {row['row']:16} {row['msgs_per_s']:>10,.0f} msgs/s  "
                          f"{row['seconds']:6.2f} s  (first batch after "
                          f"{row['to_first_batch_s']:.2f} s, exit {row['after_last_batch_s']:.2f}"
                          f" s after the last; first to last batch "
                          f"{row['processing_msgs_per_s']:,.0f} msgs/s); cores busy: machine "
                          f"{cores(row['machine_cores'])} of {os.cpu_count()}, workers "
                          f"{row['worker_cores']:.2f}, broker {cores(row['broker_cores'])}; "
                          f"first to last batch: machine {cores(row['window_machine_cores'])},"
                          f" broker {cores(row['window_broker_cores'])}", flush=True)
                    if row["row"] not in best or row["msgs_per_s"] > best[row["row"]]["msgs_per_s"]:
                        best[row["row"]] = row
        rebalance = rebalance_row(args, folder)
    finally:
        delete_topics(args.bootstrap, [source])
        shutil.rmtree(folder, ignore_errors=True)
    print("2 workers / 1 worker, msgs/s (target >= 1.7):")
    for kind in ("passthrough", "wordcount"):
        one, two = best[f"{kind}-x1"], best[f"{kind}-x2"]
        print(f"  {kind:12} launch to exit {two['msgs_per_s'] / one['msgs_per_s']:.2f}, first "
              f"batch to exit {two['steady_msgs_per_s'] / one['steady_msgs_per_s']:.2f}, first "
              f"to last batch {two['processing_msgs_per_s'] / one['processing_msgs_per_s']:.2f}")
        if one["window_machine_cores"]:
            # 2 workers cannot beat the machine: its cores over what 1 worker kept busy
            print(f"  {'':12} bound: {os.cpu_count()} cores / {one['window_machine_cores']:.2f} "
                  f"busy with 1 worker = {(os.cpu_count() or 1) / one['window_machine_cores']:.2f}"
                  f" (2 workers kept {cores(two['window_machine_cores'])} busy)")
    print("group mode, a second worker joins a running one:")
    print(f"  join to its first batch: {rebalance['join_to_first_batch_s']:.2f} s")
    print(f"  partitions the first worker kept {rebalance['kept_partitions']}: longest gap "
          f"between their batches {rebalance['kept_max_gap_s']:.2f} s (median "
          f"{rebalance['kept_median_gap_s']:.3f} s)")


if __name__ == "__main__":
    main()
