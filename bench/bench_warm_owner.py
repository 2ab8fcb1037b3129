"""How often a killed owner's partitions land on a member that kept them warm, against the
real assignor (not the formula): three ``kasper run --assignment group`` members with
``--num-standby-replicas 1`` share a topic of six partitions. Each round kills (SIGKILL)
one member that owns partitions, produces one record to every partition, waits until
each is committed past it, and asks every partition's new owner, from its /metrics,
whether it opened the partition from a standby copy (``kasper_last_restore_from_standby``).
The killed member is then started again on a fresh folder (a new host) and the next round
waits until every copy is level. A benchmark, never a test: figures are printed.

The formula (``warm_owner_probability``) assumes the assignor hands a dead owner's
partition to any survivor alike: 1/2 with three members and one replica. The default
protocol is KIP-848 with the broker's ``range`` assignor, whose dead member is noticed
after the broker's session timeout (10 s in the project's stack); ``--protocol classic``
runs librdkafka's ``cooperative-sticky`` with a 6 s session timeout instead.

    python bench/bench_warm_owner.py --rounds 12 --protocol consumer
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bench_failover import metric, start, wait_for
from benchkit import create_topics, delete_topics, fill
from confluent_kafka import Consumer, Producer, TopicPartition

from kasper_py import Config
from kasper_py._support.ports import free_ports as free_port
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.topics import changelog_topic
from kasper_py.loop.standby_placement import warm_owner_probability

PARTITIONS = 6
MEMBERS = 3
KEYS = 3_000


class Group:
    """Three members, each on a slot (a metrics port and a folder) of its own."""

    def __init__(self, bootstrap: str, protocol: str) -> None:
        self.bootstrap, self.name = bootstrap, f"bench-warm-{uuid.uuid4().hex[:8]}"
        self.topic, self.state = self.name, Path(tempfile.mkdtemp(prefix="kasper-warm-"))
        self.env = {"KASPER_CONSUMER__GROUP_PROTOCOL": protocol}
        if protocol == "classic":
            self.env["KASPER_CONSUMER__SESSION_TIMEOUT_MS"] = "6000"
        self.ports = {slot: free_port() for slot in range(MEMBERS)}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.started = 0
        self.admin = KafkaAdmin(Config(name=self.name, bootstrap_servers=bootstrap,
                                       input_topics=[self.topic]), consumer=False)

    def start(self, slot: int) -> None:
        """Start the member of ``slot`` on a folder no member used before."""
        self.started += 1
        self.processes[slot] = start(
            self.bootstrap, self.name, self.topic, self.state / str(self.started),
            self.ports[slot], "--assignment", "group", "--num-standby-replicas", "1",
            client_id=f"{self.name}-{slot}-{self.started}", settings=self.env)

    def owners(self) -> dict[int, int]:
        """The slot owning each partition, as the group describes it."""
        found = self.admin.group().owners()
        return {p: int(member.split("@")[0].split("-")[-2]) for (t, p), member
                in found.items() if t == self.topic}

    def committed(self) -> list[int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.name,
                             "isolation.level": "read_uncommitted"})
        try:
            found = consumer.committed([TopicPartition(self.topic, p)
                                        for p in range(PARTITIONS)], timeout=10)
            return [max(tp.offset, 0) for tp in found]
        finally:
            consumer.close()

    def settled(self, ends: list[int]) -> bool:
        """Every partition committed to ``ends``, owned by one of the live members, each
        kept warm at the changelog's end by one other member."""
        if self.committed() != ends:
            return False
        owners = self.owners()
        if sorted(owners) != list(range(PARTITIONS)) or len(set(owners.values())) < MEMBERS:
            return False
        tails = ends_of(self.bootstrap, changelog_topic(self.name, "counts"))
        warm = [p for port in self.ports.values()
                for p, offset in metric(port, "standby_changelog_offset").items()
                if offset == tails[p]]
        return set(warm) == set(range(PARTITIONS))


def ends_of(bootstrap: str, topic: str) -> list[int]:
    """The end offset of each partition of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warm-owner"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)]
    finally:
        consumer.close()


def one_round(group: Group, ends: list[int], victim: int) -> list[tuple[int, bool]]:
    """Kill ``victim``'s member, produce one record per partition and wait for every
    commit past it: each of its partitions with whether the new owner opened it from a
    standby copy."""
    before = group.owners()
    group.processes[victim].send_signal(signal.SIGKILL)
    group.processes[victim].wait(30)
    producer = Producer({"bootstrap.servers": group.bootstrap})
    for partition in range(PARTITIONS):
        producer.produce(group.topic, b"x", b"round-%d" % partition, partition=partition)
    producer.flush(30)
    for partition in range(PARTITIONS):
        ends[partition] += 1
    wait_for(lambda: group.committed() == ends, timeout=120)
    wait_for(lambda: len(group.owners()) == PARTITIONS
             and victim not in group.owners().values(), timeout=60)
    after = group.owners()
    moved = [p for p, slot in before.items() if slot == victim]
    return [(p, metric(group.ports[after[p]], "last_restore_from_standby").get(p) == 1)
            for p in moved]


def run(bootstrap: str, rounds: int, protocol: str) -> tuple[int, int]:
    """(partitions moved off a killed owner, of them opened from a standby copy)."""
    group = Group(bootstrap, protocol)
    create_topics(bootstrap, [group.topic], PARTITIONS)
    fill(bootstrap, group.topic, PARTITIONS,
         [{"key": b"k%d" % i, "value": b"x"} for i in range(KEYS)])
    ends = ends_of(bootstrap, group.topic)
    moved = warm = 0
    try:
        for slot in range(MEMBERS):
            group.start(slot)
        for index in range(rounds):
            wait_for(lambda: group.settled(ends), timeout=300)
            victim = sorted(set(group.owners().values()))[index % MEMBERS]
            started = time.monotonic()
            outcome = one_round(group, ends, victim)
            moved += len(outcome)
            warm += sum(1 for _, was_warm in outcome if was_warm)
            print(f"round {index + 1:>2}: killed member {victim}, partitions "
                  f"{[p for p, _ in outcome]} warm {[w for _, w in outcome]}, "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            group.start(victim)
    finally:
        for process in group.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        delete_topics(bootstrap, [group.topic, changelog_topic(group.name, "counts")])
        shutil.rmtree(group.state, ignore_errors=True)
    return moved, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KASPER_BOOTSTRAP_SERVERS",
                                                              "127.0.0.1:19092"))
    parser.add_argument("--rounds", type=int, default=12, help="owners killed")
    parser.add_argument("--protocol", default="consumer", choices=("consumer", "classic"))
    args = parser.parse_args()
    moved, warm = run(args.bootstrap, args.rounds, args.protocol)
    print(f"protocol={args.protocol}: {warm} of {moved} partitions moved off a killed "
          f"owner opened from a standby ({warm / max(moved, 1):.2f}); the formula "
          f"warm_owner_probability({MEMBERS}, 1) = "
          f"{warm_owner_probability(MEMBERS, 1):.2f}", flush=True)


if __name__ == "__main__":
    main()
