"""Group mode (``Config.assignment="group"``) on the real broker: workers join and leave
a RocksDB word count while it runs (one killed with -9, one stopped with SIGTERM); every
input is counted (exactly, with exactly-once), and a partition a worker kept was never
restored or rebuilt again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kasper_py import Config, TopicProcessor
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402
    produce_words, read_counts, store_config, worker_args, wait_for, free_port,
    run_until_caught_up)
from test_stores_rocksdb import Lookup, Upsert  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
EVENT = re.compile(r"kasper\.partitions_(assigned|revoked)\s+partitions=\[([0-9, ]*)\]")


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, env=ENV, stdout=out, stderr=subprocess.STDOUT)




def events(log: Path) -> list[tuple[str, set[int]]]:
    """The worker's assignments and revocations, in order."""
    found = EVENT.findall(log.read_text(errors="replace"))
    return [(kind, {int(p) for p in parts.split(",") if p.strip()}) for kind, parts in found]


def holds(log: Path) -> set[int]:
    held: set[int] = set()
    for kind, partitions in events(log):
        held = held | partitions if kind == "assigned" else held - partitions
    return held


def assert_kept_partitions_never_reopened(log: Path) -> None:
    """A partition is assigned again only after it was revoked: one the worker kept
    through a rebalance kept its processor and table (no restore, no rebuild)."""
    held: set[int] = set()
    for kind, partitions in events(log):
        if kind == "assigned":
            assert not partitions & held, f"reopened kept partitions {partitions & held}"
            held |= partitions
        else:
            held -= partitions


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_workers_join_and_leave_a_running_word_count(  # noqa: PLR0917 - pytest fixtures
        bootstrap, new_topic, kafka, unique_name, tmp_path, exactly_once) -> None:
    """Worker A runs alone, B and C join, B is killed with -9, C stops on SIGTERM, A
    finishes: every word is counted (the overcount is at most one batch for the kill, and
    none with exactly-once), all input is committed, and A never reopened a partition it
    kept."""
    partitions, batch_size = 4, 100
    topic, name = new_topic("words", partitions=partitions), unique_name("group")
    words = [f"w{i % 53}" for i in range(40_000)]
    produce_words(kafka, topic, words, partitions)
    args = worker_args("rocksdb", bootstrap, name, topic, batch_size, "--group",
                       "--pause", "0.05", *(["--exactly-once"] if exactly_once else []))
    logs = {w: tmp_path / f"{w}.log" for w in "abc"}
    port = free_port()
    workers = {"a": start([*args, "--state-dir", str(tmp_path / "a"), "--metrics-port",
                           str(port)], logs["a"])}
    committed = lambda: sum(o or 0 for o in kafka.committed(name, topic, partitions).values())  # noqa: E731
    wait_for(lambda: committed() > 0, "worker a to commit", timeout=90)
    for w in "bc":
        workers[w] = start([*args, "--state-dir", str(tmp_path / w)], logs[w])
    wait_for(lambda: all(holds(logs[w]) for w in "bc"), "workers b and c to get partitions",
             timeout=90)
    workers["b"].kill()
    workers["b"].wait(30)
    workers["c"].send_signal(signal.SIGTERM)
    assert workers["c"].wait(60) == 0
    wait_for(lambda: holds(logs["a"]) == set(range(partitions)), "worker a to hold every "
             "partition again", timeout=90)
    wait_for(lambda: committed() == len(words), "every word to be committed", timeout=180)
    restores = restore_counts(port, name)
    workers["a"].send_signal(signal.SIGTERM)
    assert workers["a"].wait(60) == 0
    assert_kept_partitions_never_reopened(logs["a"])
    # The restore counter: one restore per assignment, none for a partition A kept.
    assigned = Counter(p for kind, ps in events(logs["a"]) if kind == "assigned" for p in ps)
    assert restores == dict(assigned), (restores, assigned)
    assert max(restores.values()) >= 2, "no partition came back to A: nothing was checked"
    guarantee = "exactly_once" if exactly_once else "at_least_once"
    cfg = Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic],
                 state_dir=str(tmp_path / "check"), processing_guarantee=guarantee)
    counts = read_counts(RocksDBTable("counts"), cfg, partitions, sorted(set(words)))
    expected = Counter(words)
    assert all(counts[w] >= n for w, n in expected.items()), expected - counts
    overcount = sum(counts.values()) - len(words)
    assert overcount == 0 if exactly_once else overcount <= batch_size, overcount


def restore_counts(port: int, processor: str) -> dict[int, int]:
    """``kasper_restores_total`` of the "counts" table per partition, from a worker's
    /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'^kasper_restores_total\{([^}]*)\} (\S+)$', text, re.M)
    counts = {}
    for labels, value in found:
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields["processor"] == processor and fields["store"] == "counts":
            counts[int(fields["partition"])] = int(float(value))
    return counts


def batches(log: Path) -> list[dict[str, str]]:
    """The fields of every ``kasper.batch`` line of a worker's log, in order."""
    return [dict(re.findall(r"(\w+)=(\S+)", line))
            for line in log.read_text(errors="replace").splitlines() if "kasper.batch" in line]


def test_a_revoked_partition_goes_on_where_its_last_owner_stopped(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """A second worker joins: the first gives a partition up between turns, with every
    batch it processed committed, so the new owner's first batch starts at the offset
    after the first worker's last one: nothing processed twice, nothing skipped."""
    partitions = 2
    topic, name = new_topic("words", partitions=partitions), unique_name("revoke")
    produce_words(kafka, topic, [f"w{i % 7}" for i in range(2_000)], partitions)
    args = worker_args("rocksdb", bootstrap, name, topic, 50, "--group", "--pause", "0.1")
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start([*args, "--state-dir", str(tmp_path / "1")], first_log)
    second = None
    try:
        wait_for(lambda: {b["partition"] for b in batches(first_log)} == {"0", "1"},
                 "the first worker to process both partitions", timeout=90)
        second = start([*args, "--state-dir", str(tmp_path / "2")], second_log)
        wait_for(lambda: len(holds(first_log)) == 1, "the first worker to give one up", timeout=90)
        moved = ({0, 1} - holds(first_log)).pop()
        produce_words(kafka, topic, [f"w{i % 7}" for i in range(2_000)], partitions)
        wait_for(lambda: any(b["partition"] == str(moved) for b in batches(second_log)),
                 "the second worker to process the partition it got", timeout=90)
        last = [b for b in batches(first_log) if b["partition"] == str(moved)][-1]
        taken = next(b for b in batches(second_log) if b["partition"] == str(moved))
        assert int(taken["first_offset"]) == int(last["last_offset"]) + 1
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)


def test_an_effectively_once_store_stays_exact_as_members_come_and_go(  # noqa: PLR0917
        bootstrap, new_topic, kafka, unique_name, redis_url, tmp_path) -> None:
    """An effectively-once Redis table in group mode: worker B joins A and is killed with
    -9 mid-run; its partitions return to A, whose store skips what B already applied, so
    the counts are exact although the kill replays a batch."""
    partitions = 4
    topic, name = new_topic("words", partitions=partitions), unique_name("group-eo")
    words = [f"w{i % 53}" for i in range(20_000)]
    produce_words(kafka, topic, words, partitions)
    args = worker_args("redis", bootstrap, name, topic, 100, "--group", "--redis-url", redis_url,
                       "--effectively-once", "--pause", "0.05")
    logs = {w: tmp_path / f"{w}.log" for w in "ab"}
    first = start(args, logs["a"])
    committed = lambda: sum(o or 0 for o in kafka.committed(name, topic, partitions).values())  # noqa: E731
    try:
        wait_for(lambda: committed() > 0, "worker a to commit", timeout=90)
        second = start(args, logs["b"])
        wait_for(lambda: any(b for b in batches(logs["b"])), "worker b to process a batch",
                 timeout=90)
        second.kill()
        second.wait(30)
        wait_for(lambda: committed() == len(words), "every word to be committed", timeout=180)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)
    counts = read_counts(RedisTable("counts", url=redis_url),
                         store_config(bootstrap, name, topic), partitions, sorted(set(words)))
    assert counts == Counter(words)


def test_a_global_table_answers_on_every_member(bootstrap, new_topic, kafka, unique_name,
                                                tmp_path) -> None:
    """Two group members look keys up in a global table of another processor's
    changelog: whichever member holds a lookup's partition answers it from the whole
    table, and the table stays open and current while partitions move between them."""
    users, lookups = new_topic("users", partitions=3), new_topic("lookups", partitions=4)
    owner = store_config(bootstrap, unique_name("owner"), users, key_serde="str",
                         state_dir=str(tmp_path / "owner"))
    kafka.produce(users, [(f"u{i}".encode(), f"name{i}".encode()) for i in range(12)])
    run_until_caught_up(owner, RocksDBTable("profiles"), Upsert)
    name = unique_name("global-group")
    seen: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    members: dict[str, tuple[TopicProcessor, threading.Thread]] = {}
    errors: list[BaseException] = []

    def run(processor: TopicProcessor) -> None:
        try:
            processor.run_loop()
        except BaseException as exc:
            errors.append(exc)
            raise

    def join(member: str) -> None:
        table = RocksDBTable("profiles", global_table=True,
                             changelog_topic=f"{owner.name}-profiles-changelog")
        cfg = store_config(bootstrap, name, lookups, assignment="group",
                           state_dir=str(tmp_path / member))
        processor = TopicProcessor(cfg, lambda c: Lookup(c, seen[member]), stores=[table])
        thread = threading.Thread(target=run, args=(processor,))
        thread.start()
        members[member] = (processor, thread)

    def answers(member: str) -> dict[str, Any]:
        return {k: v for batch in seen[member] for k, v in batch.items()}

    def lookup_everything() -> None:
        for partition in range(4):
            kafka.produce(lookups, [f"u{i}".encode() for i in range(12)], partition=partition)

    expected = {f"u{i}": f"name{i}" for i in range(12)}
    try:
        join("a")
        lookup_everything()
        wait_for(lambda: answers("a") == expected, "member a to answer every lookup", 90)
        join("b")
        kafka.produce(users, [(b"u3", b"renamed")])
        run_until_caught_up(owner, RocksDBTable("profiles"), Upsert)
        expected["u3"] = "renamed"

        def both_answered() -> bool:
            # b gets partitions only once the group rebalanced: ask until both answered
            if not all(s and s[-1].get("u3") == "renamed" for s in seen.values()):
                lookup_everything()
                time.sleep(0.5)
                return False
            return True

        wait_for(both_answered, "both members to answer from the current table", 90)
        for member in "ab":
            batch = seen[member][-1]
            assert batch == {k: expected[k] for k in batch}, (member, batch)
    finally:
        for processor, thread in members.values():
            processor.close(timeout=30)
            thread.join(30)
    assert not [t for _, t in members.values() if t.is_alive()]
    assert errors == []
