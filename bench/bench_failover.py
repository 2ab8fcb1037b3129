"""Failover with and without a standby replica: the time from SIGKILL of a partition's
owner to the new owner's first committed turn, for tables of 100k and 1M keys, in the
same run. A benchmark, never a test: figures are printed, not asserted.

The static case (``--modes static``; the default runs it and the group case): owner A
(``kasper run``, partition 0) counts KEYS distinct keys into a RocksDB table; process B
owns partition 1, serves its admin endpoint (``--admin-port``) and, with a standby,
keeps partition 0 warm (``--standby-partitions 0``). Once A committed everything (and
B's copy is level), A is killed with SIGKILL, one more record is produced to partition
0, and B, still running, is told to take partition 0 over (``POST /standby/promote``,
what ``kasper standby promote`` sends; the bench posts it itself, so no CLI process
start is counted): with a standby it promotes its warm copy, without one it adopts the
partition and restores the whole changelog. The figure is the time from the kill until
that record's offset is committed; "kill->open s" until the promotion answered.
``--guarantee exactly_once`` runs both with exactly-once (B then fences A's transactional id first);
``--fetch-wait-ms`` sets both processes' consumer ``fetch.wait.max.ms`` (the promoted
partition's first records come with the fetch after the one in flight, which waits up
to it for data: 100 ms by default for a process with an admin port, librdkafka's 500
otherwise). ``--rounds N`` alternates the two
sides N times.

The restart case (``--modes restart``, the static case before in-place promotion): B is
stopped too, and B's folder is started again as owner of both partitions (``--force``):
process start, restore and first turn. The restore's records and seconds come from the
new owner's /metrics.

The group case (``--modes group``): A and B are ``kasper run --assignment group``
members (with a standby: ``--num-standby-replicas 1``, so each keeps warm the partition
the other owns). The owner of partition 0 is killed, one more record is produced, and
the survivor, still running, is assigned partition 0 by the group and promotes its warm
copy in place: the figure is the time from the kill to that record's commit, and
"kill->open s" the time until the survivor's restore finished (the rest of the first
figure is the first turn). Most of it is the group noticing the dead member: the
broker's session timeout (``group.consumer.session.timeout.ms``).

``--breakdown N`` runs the restart case with a standby N times and prints where the time
from the kill goes: the other process stopped, the new owner spawned, its first log line
(Python start-up), its restore started and done, ``kasper.started`` and its first commit.

    python bench/bench_failover.py --keys 100000,1000000 --modes static --rounds 2
    python bench/bench_failover.py --keys 100000,1000000 --modes static,restart,group
    python bench/bench_failover.py --keys 100000 --breakdown 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO

from benchkit import create_topics, delete_topics, fill
from confluent_kafka import Consumer, Producer, TopicPartition

from kasper_py import Config
from kasper_py._support.ports import free_ports as free_port
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.topics import changelog_topic

HERE = Path(__file__).parent
SAMPLE = re.compile(r'^kasper_(\w+)\{([^}]*)\} (\S+)$', re.M)



def start(bootstrap: str, name: str, topic: str, state: Path, port: int,
          *flags: str, client_id: str | None = None,
          settings: Mapping[str, str] | None = None,
          log: IO[bytes] | None = None) -> subprocess.Popen[bytes]:
    """``kasper run`` of the counting app; ``settings``: ``KASPER_*`` variables; ``log``
    takes its output (its logs go to stderr, shown by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]), **(settings or {}))
    if client_id is not None:
        env["KASPER_CONSUMER__CLIENT_ID"] = client_id
    command = [sys.executable, "-m", "kasper_py", "run", "failover_app:Count", "--stores",
               "failover_app:stores", "--app-dir", str(HERE), "--name", name,
               "--bootstrap-servers", bootstrap, "--input-topics", topic, "--state-dir",
               str(state), "--metrics-port", str(port), "--log-level", "WARNING", *flags]
    return subprocess.Popen(command, env=env, stdout=log or subprocess.DEVNULL, stderr=log)


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
    """One case: seconds from SIGKILL to the new owner's first commit, and its restore;
    with them, the phases from the kill (``--breakdown``): the other process stopped
    (SIGTERM to exit), the new owner spawned, its first log line (Python start-up and
    imports), its restore started and done, and ``kasper.started``."""
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
        killed, wall = time.monotonic(), time.time()
        owner.send_signal(signal.SIGKILL)
        other.send_signal(signal.SIGTERM)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"x", b"after-kill", partition=0)
        producer.flush(30)
        other.wait(60)
        owner.wait(60)
        phases = {"other stopped": time.monotonic() - killed}
        with (state / "new.log").open("wb") as log:
            new = start(bootstrap, name, topic, state / "b", port, "--force", "--log-level",
                        "INFO", "--log-format", "json", log=log)
        phases["owner spawned"] = time.monotonic() - killed
        try:
            wait_for(lambda: committed(bootstrap, name, topic) == keys + 1)
            seconds = time.monotonic() - killed
            return {"seconds": seconds,
                    "restored": metric(port, "last_restore_records")[0],
                    "restore_seconds": metric(port, "last_restore_seconds")[0],
                    **phases, **logged_phases(state / "new.log", wall),
                    "first commit": seconds}
        finally:
            new.send_signal(signal.SIGTERM)
            new.wait(60)
    finally:
        for process in (owner, other):
            if process.poll() is None:
                process.kill()
        delete_topics(bootstrap, [topic, changelog_topic(name, "counts")])
        shutil.rmtree(state, ignore_errors=True)


def promoted_failover(bootstrap: str, keys: int, standby: bool,
                      guarantee: str = "at_least_once",
                      fetch_wait_ms: int | None = None) -> dict[str, float]:
    """The static case, promoted in place: A owns partition 0, B owns 1 and (with a
    standby) keeps 0 warm; A is SIGKILLed, one more record is produced, and B, still
    running, is told to take partition 0 over (``POST /standby/promote`` on its admin
    port, as ``kasper standby promote`` sends it): from its warm copy, or adopted with no
    copy and restored in full. Seconds from the kill to that record's commit."""
    name = f"bench-failover-{uuid.uuid4().hex[:8]}"
    topic, state = name, Path(tempfile.mkdtemp(prefix="kasper-failover-"))
    create_topics(bootstrap, [topic], 2)
    fill(bootstrap, topic, 1, [{"key": b"k%d" % i, "value": b"x"} for i in range(keys)])
    port_a, port_b, admin = free_port(), free_port(), free_port()
    eos = ("--processing-guarantee", guarantee)
    settings = ({} if fetch_wait_ms is None
                else {"KASPER_CONSUMER__FETCH_WAIT_MAX_MS": str(fetch_wait_ms)})
    owner = start(bootstrap, name, topic, state / "a", port_a, "--input-partitions", "0",
                  *eos, settings=settings)
    other = start(bootstrap, name, topic, state / "b", port_b, "--input-partitions", "1",
                  "--admin-port", str(admin), *eos,
                  *(["--standby-partitions", "0"] if standby else []), settings=settings)
    try:
        wait_for(lambda: committed(bootstrap, name, topic) == keys)
        if standby:
            wait_for(lambda: metric(port_b, "standby_changelog_offset").get(0)
                     == changelog_end(bootstrap, name))
        killed = time.monotonic()
        owner.send_signal(signal.SIGKILL)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"x", b"after-kill", partition=0)
        producer.flush(30)
        owner.wait(60)
        request = urllib.request.Request(
            f"http://127.0.0.1:{admin}/standby/promote?partitions=0", data=b"",
            method="POST")
        with urllib.request.urlopen(request, timeout=900) as answer:
            promoted = json.loads(answer.read())
        opened = time.monotonic() - killed
        wait_for(lambda: committed(bootstrap, name, topic) == keys + 1)
        return {"seconds": time.monotonic() - killed, "opened": opened,
                "restored": promoted["restored"],
                "restore_seconds": metric(port_b, "last_restore_seconds")[0]}
    finally:
        for process in (owner, other):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        delete_topics(bootstrap, [topic, changelog_topic(name, "counts")])
        shutil.rmtree(state, ignore_errors=True)


def logged_phases(log: Path, since: float) -> dict[str, float]:
    """Seconds from ``since`` (Unix time) to the first log line and to each restore
    event of the new owner's JSON log."""
    found: dict[str, float] = {}
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
        found.setdefault("first log line", at - since)
        if entry.get("event") in ("kasper.restore_started", "kasper.restore_done",
                                  "kasper.started"):
            found.setdefault(entry["event"], at - since)
    return found


def group_failover(bootstrap: str, keys: int, standby: bool) -> dict[str, float]:
    """The group case: seconds from SIGKILL of partition 0's owner to the survivor's
    commit of the next record, and to its promotion (restore) of partition 0."""
    name = f"bench-failover-{uuid.uuid4().hex[:8]}"
    topic, state = name, Path(tempfile.mkdtemp(prefix="kasper-failover-"))
    create_topics(bootstrap, [topic], 2)
    fill(bootstrap, topic, 1, [{"key": b"k%d" % i, "value": b"x"} for i in range(keys)])
    flags = ["--assignment", "group", *(["--num-standby-replicas", "1"] if standby else [])]
    ports = {m: free_port() for m in "ab"}
    members = {m: start(bootstrap, name, topic, state / m, ports[m], *flags,
                        client_id=f"{name}-{m}") for m in "ab"}
    try:
        wait_for(lambda: committed(bootstrap, name, topic) == keys)
        wait_for(lambda: len(set(owners(bootstrap, name, topic).values())) == 2)
        owner = owners(bootstrap, name, topic)[0]
        survivor = "b" if owner == "a" else "a"
        if standby:
            wait_for(lambda: metric(ports[survivor], "standby_changelog_offset").get(0)
                     == changelog_end(bootstrap, name))
        else:  # files the survivor kept of partition 0 while the group settled: a new host
            shutil.rmtree(state / survivor / name / "counts" / "0", ignore_errors=True)
        before = metric(ports[survivor], "last_restore_seconds").get(0)
        killed = time.monotonic()
        members[owner].send_signal(signal.SIGKILL)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, b"x", b"after-kill", partition=0)
        producer.flush(30)
        opened = 0.0

        def commit_seen() -> bool:
            nonlocal opened
            if not opened and metric(ports[survivor], "last_restore_seconds").get(0) not in (
                    None, before):
                opened = time.monotonic() - killed
            return committed(bootstrap, name, topic) == keys + 1

        wait_for(commit_seen)
        seconds = time.monotonic() - killed
        return {"seconds": seconds, "opened": opened or seconds,
                "restored": metric(ports[survivor], "last_restore_records")[0],
                "restore_seconds": metric(ports[survivor], "last_restore_seconds")[0]}
    finally:
        for process in members.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        delete_topics(bootstrap, [topic, changelog_topic(name, "counts")])
        shutil.rmtree(state, ignore_errors=True)


def owners(bootstrap: str, name: str, topic: str) -> dict[int, str]:
    """The member (a or b) owning each partition, as the group describes it."""
    admin = KafkaAdmin(Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic]),
                       consumer=False)
    return {p: member.split("@")[0].removeprefix(f"{name}-")
            for (t, p), member in admin.group().owners().items() if t == topic}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KASPER_BOOTSTRAP_SERVERS",
                                                              "127.0.0.1:19092"))
    parser.add_argument("--keys", default="100000,1000000",
                        help="comma-separated table sizes (distinct keys)")
    parser.add_argument("--modes", default="static,group",
                        help="comma-separated: static (promoted in the running process), "
                             "restart (the standby's process restarted as owner), group "
                             "(promotion in a running member on assignment)")
    parser.add_argument("--guarantee", default="at_least_once",
                        choices=("at_least_once", "exactly_once"),
                        help="the static case's processing guarantee (exactly-once "
                             "fences the killed owner's transactional id first)")
    parser.add_argument("--fetch-wait-ms", type=int, default=None,
                        help="the static case's consumer fetch.wait.max.ms (default: "
                             "kasper's 100 with an admin port): the promoted partition's "
                             "first records come with the fetch after the one in flight")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of each case, without and with a standby alternating")
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="instead: N runs of the static case with a standby (at the "
                             "first of --keys), timed by phase")
    args = parser.parse_args()
    if args.breakdown:
        keys = int(args.keys.split(",")[0])
        for _ in range(args.breakdown):
            phases = failover(args.bootstrap, keys, standby=True)
            del phases["seconds"], phases["restored"], phases["restore_seconds"]
            print(", ".join(f"{phase} {seconds:.2f}" for phase, seconds in
                            sorted(phases.items(), key=lambda item: item[1])), flush=True)
        return
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'mode':>7} {'keys':>9} {'standby':>8} {'kill->commit s':>15} "
          f"{'kill->open s':>13} {'restored':>9} {'restore s':>10}")
    cases: dict[str, Callable[..., dict[str, float]]] = {
        "static": lambda *a, **k: promoted_failover(*a, **k, guarantee=args.guarantee,
                                                    fetch_wait_ms=args.fetch_wait_ms),
        "restart": failover, "group": group_failover}
    for mode in args.modes.split(","):
        for keys in (int(k) for k in args.keys.split(",")):
            for _ in range(args.rounds):
                compare(mode, keys, cases[mode](args.bootstrap, keys, standby=False),
                        cases[mode](args.bootstrap, keys, standby=True))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def compare(mode: str, keys: int, cold: dict[str, float], warm: dict[str, float]) -> None:
    """Print one round's rows, without and with a standby, and their ratio."""
    for label, case in (("no", cold), ("yes", warm)):
        print(f"{mode:>7} {keys:>9} {label:>8} {case['seconds']:>15.2f} "
              f"{case.get('opened', float('nan')):>13.2f} {case['restored']:>9.0f} "
              f"{case['restore_seconds']:>10.3f}", flush=True)
    restore_ratio = cold["restore_seconds"] / max(warm["restore_seconds"], 1e-6)
    print(f"{mode:>7} {keys:>9} {'ratio':>8} {cold['seconds'] / warm['seconds']:>15.1f}x"
          f" (restore alone: {restore_ratio:.0f}x)", flush=True)


if __name__ == "__main__":
    main()
