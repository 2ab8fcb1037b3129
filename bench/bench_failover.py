"""Failover with and without a standby replica: the time from SIGKILL of a partition's
owner to the new owner's first committed turn, for tables of 100k and 1M keys, in the
same run. A benchmark, never a test: figures are printed, not asserted.

Each case: owner A (``kasper run``, partition 0) counts KEYS distinct keys into a
RocksDB table; process B owns partition 1 and, with a standby, keeps partition 0 warm
(``--standby-partitions 0``). Once A committed everything (and B's copy is level), A is
killed with SIGKILL, B is stopped, one more record is produced to partition 0, and B's
folder is started again as owner of both partitions (``--force``): the figure is the
time from the kill until that record's offset is committed (process start, restore and
first turn). The restore's records and seconds come from the new owner's /metrics.

    python bench/bench_failover.py --keys 100000,1000000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from benchkit import create_topics, delete_topics, fill
from confluent_kafka import Consumer, Producer, TopicPartition

from kasper_py.kafka.topics import changelog_topic

HERE = Path(__file__).parent
SAMPLE = re.compile(r'^kasper_(\w+)\{([^}]*)\} (\S+)$', re.M)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(bootstrap: str, name: str, topic: str, state: Path, port: int,
          *flags: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    command = [sys.executable, "-m", "kasper_py", "run", "failover_app:Count", "--stores",
               "failover_app:stores", "--app-dir", str(HERE), "--name", name,
               "--bootstrap-servers", bootstrap, "--input-topics", topic, "--state-dir",
               str(state), "--metrics-port", str(port), "--log-level", "WARNING", *flags]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def metric(port: int, name: str) -> dict[int, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {int(dict(re.findall(r'(\w+)="([^"]*)"', labels))["partition"]): float(value)
            for sample, labels, value in SAMPLE.findall(text) if sample == name}


def wait_for(condition: Callable[[], object], timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the bench waited too long")
        time.sleep(0.02)


def committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "isolation.level": "read_uncommitted"})
    try:
        found = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
        return max(found, 0)
    finally:
        consumer.close()


def changelog_end(bootstrap: str, name: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-failover"})
    try:
        return consumer.get_watermark_offsets(
            TopicPartition(changelog_topic(name, "counts"), 0), timeout=10)[1]
    finally:
        consumer.close()


def failover(bootstrap: str, keys: int, standby: bool) -> dict[str, float]:
    """One case: seconds from SIGKILL to the new owner's first commit, and its restore."""
    name = f"bench-failover-{uuid.uuid4().hex[:8]}"
    topic, state = name, Path(tempfile.mkdtemp(prefix="kasper-failover-"))
    create_topics(bootstrap, [topic], 2)
    fill(bootstrap, topic, 1, [{"key": b"k%d" % i, "value": b"x"} for i in range(keys)])
    port_a, port_b, port = free_port(), free_port(), free_port()
    owner = start(bootstrap, name, topic, state / "a", port_a, "--input-partitions", "0")
    other = start(bootstrap, name, topic, state / "b", port_b, "--input-partitions", "1",
                  *(["--standby-partitions", "0"] if standby else []))
    try:
        wait_for(lambda: committed(bootstrap, name, topic) == keys)
        if standby:
            wait_for(lambda: metric(port_b, "standby_changelog_offset").get(0)
                     == changelog_end(bootstrap, name))
        killed = time.monotonic()
        owner.send_signal(signal.SIGKILL)
        other.send_signal(signal.SIGTERM)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"x", b"after-kill", partition=0)
        producer.flush(30)
        other.wait(60)
        owner.wait(60)
        new = start(bootstrap, name, topic, state / "b", port, "--force")
        try:
            wait_for(lambda: committed(bootstrap, name, topic) == keys + 1)
            seconds = time.monotonic() - killed
            return {"seconds": seconds,
                    "restored": metric(port, "last_restore_records")[0],
                    "restore_seconds": metric(port, "last_restore_seconds")[0]}
        finally:
            new.send_signal(signal.SIGTERM)
            new.wait(60)
    finally:
        for process in (owner, other):
            if process.poll() is None:
                process.kill()
        delete_topics(bootstrap, [topic, changelog_topic(name, "counts")])
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KASPER_BOOTSTRAP_SERVERS",
                                                              "127.0.0.1:19092"))
    parser.add_argument("--keys", default="100000,1000000",
                        help="comma-separated table sizes (distinct keys)")
    args = parser.parse_args()
    print(f"{'keys':>9} {'standby':>8} {'kill->commit s':>15} {'restored':>9} "
          f"{'restore s':>10}")
    for keys in (int(k) for k in args.keys.split(",")):
        cold = failover(args.bootstrap, keys, standby=False)
        warm = failover(args.bootstrap, keys, standby=True)
        for label, case in (("no", cold), ("yes", warm)):
            print(f"{keys:>9} {label:>8} {case['seconds']:>15.2f} {case['restored']:>9.0f} "
                  f"{case['restore_seconds']:>10.3f}", flush=True)
        restore_ratio = cold["restore_seconds"] / max(warm["restore_seconds"], 1e-6)
        print(f"{keys:>9} {'ratio':>8} {cold['seconds'] / warm['seconds']:>15.1f}x "
              f"(restore alone: {restore_ratio:.0f}x)", flush=True)


if __name__ == "__main__":
    main()
