"""Stages with their own partition count on the real broker, through ``kasper run``: the
page-view app (rekey_app_module.py) with its repartition given 1 partition over a
4-partition source (fan-in) and 6 over a 2-partition source (fan-out), run under
exactly-once in static mode, with ``--processes 2`` and as two group members,
SIGKILLed once mid-run, then run until caught up; and two group members run until
caught up while a transaction is open on their source."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import AdminClient, Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores", "app_harness")
from app_harness import (  # isort: skip  # noqa: E402
    APP, HERE, ends, internal_topics_deleted, produce_views, updates, write_config)
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration

EXAMPLES = HERE.parents[1] / "examples"
TOTAL = 600
MODES = {"static": [[]], "processes": [["--processes", "2"]],
         "group": [["--assignment", "group"], ["--assignment", "group"]]}
"""Each mode's ``kasper run`` processes, by their options (group: two members, each on
a state folder of its own, as on two hosts)."""
QUICK_SESSIONS = ("\n[consumer_overrides]\n\"group.protocol\" = \"classic\"\n"
                  "\"session.timeout.ms\" = 6000\n")
"""Group members whose SIGKILLed predecessors leave the group in 6 s: the classic
protocol's session timeout is the client's (KIP-848's is the broker's, 45 s)."""


def app_config(path: Path, mode: str, **fields: Any) -> Path:
    """A member's or process's TOML config of ``fields``; group members with
    ``QUICK_SESSIONS``."""
    write_config(path, **fields)
    if mode == "group":
        path.write_text(path.read_text() + QUICK_SESSIONS)
    return path


def partition_count(bootstrap: str, topic: str) -> int:
    return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        topic, timeout=30).topics[topic].partitions)


class Run:
    """The processes of one mode started together, each in a session of its own so
    that a SIGKILL takes its workers too."""

    def __init__(self, configs: list[Path], logs: list[Path], options: list[list[str]],
                 env: dict[str, str], *extra: str) -> None:
        self.logs = logs
        self.processes = []
        for config, log, own in zip(configs, logs, options, strict=True):
            with log.open("wb") as out:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "kasper_py", "run", APP, "--app-dir", str(HERE),
                     "--config", str(config), "--log-format", "console", *own, *extra],
                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def text(self) -> str:
        return "\n".join(log.read_text(errors="replace")[-3000:] for log in self.logs)

    def kill(self) -> None:
        for process in self.processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)

    def finish(self, timeout: float = 120.0) -> list[int]:
        try:
            return [process.wait(timeout) for process in self.processes]
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"did not finish: {self.text()}") from None


@pytest.mark.parametrize("sources, partitions", [(4, 1), (2, 6)], ids=["4-to-1", "2-to-6"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_repartition_of_its_own_count_counts_exactly_under_kill(  # noqa: PLR0917
        mode: str, sources: int, partitions: int, bootstrap: str,
        new_topic: Callable[..., str], kafka: Any, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    """600 page views; the app runs, is SIGKILLed once it has committed part of the
    source (group mode: both members, over 2 partitions into 6, where partition numbers
    1 and 2 are split between them), and runs again until caught up. The repartition has
    its own count; the group's committed offsets are at the end of every partition of
    the source and of the repartition; a read_committed reader sees each (user, n)
    update exactly once."""
    source = new_topic("fan-views", partitions=sources)
    output = new_topic("fan-counts", partitions=2)
    name = unique_name("fan")
    repartition = f"{name}-by-user-repartition"
    expected = produce_views(kafka, source, TOTAL, users=12, sessions=40)
    options = MODES[mode]
    configs = [app_config(tmp_path / f"app{i}.toml", mode, name=name,
                          bootstrap_servers=bootstrap, state_dir=str(tmp_path / f"state{i}"),
                          key_serde="str", value_serde="str", batch_size=20, batch_wait=0.1,
                          processing_guarantee="exactly_once")
               for i in range(len(options))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PAGEVIEWS_SOURCE": source,
           "PAGEVIEWS_OUTPUT": output, "PAGEVIEWS_PAUSE": "0.05",
           "PAGEVIEWS_REPARTITION_PARTITIONS": str(partitions)}

    def done() -> int:
        return sum(o or 0 for o in kafka.committed(name, source, sources).values())

    with internal_topics_deleted(bootstrap, name):
        first = Run(configs, [tmp_path / f"first{i}.log" for i in range(len(options))],
                    options, env)
        try:
            wait_for(lambda: done() > 0, "the first commit", 90)
        finally:
            first.kill()
        assert done() < TOTAL, first.text()  # the kill landed mid-run
        last = Run(configs, [tmp_path / f"last{i}.log" for i in range(len(options))],
                   options, env, "--until-caught-up")
        assert last.finish() == [0] * len(options), last.text()

        for topic, count in ((source, sources), (repartition, partitions)):
            committed = {p: o or 0 for p, o in kafka.committed(name, topic, count).items()}
            assert committed == ends(bootstrap, topic, count)  # none: an empty partition
        assert partition_count(bootstrap, repartition) == partitions
        seen = updates(kafka, output)
        assert set(seen.values()) == {1}, {u: n for u, n in seen.items() if n != 1}
        assert set(seen) == {(user, n) for user, count in expected.items()
                             for n in range(1, count + 1)}


def test_global_topk_example_is_exact_under_kill(bootstrap: str, new_topic: Callable[..., str],
                                                 kafka: Any, unique_name: Callable[[str], str],
                                                 tmp_path: Path) -> None:
    """examples/global_topk.py: 1,500 items over a 4-partition source, the app SIGKILLed
    once mid-run under exactly-once, then run until caught up: the output's last record
    is the exact top 3, and every partition of the source and of the one-partition
    repartition is committed to its end."""
    source, output = new_topic("topk-items", partitions=4), new_topic("topk-out", partitions=1)
    name = unique_name("topk")
    items = [f"i{min(int(random.paretovariate(1.2)), 40)}-{n % 3}" for n in range(1500)]
    kafka.produce(source, [(item.encode(), b"1") for item in items])
    expected = sorted(Counter(items).items(), key=lambda c: (-c[1], c[0]))[:3]
    config = write_config(tmp_path / "topk.toml", name=name, bootstrap_servers=bootstrap,
                          state_dir=str(tmp_path / "state"), key_serde="str",
                          value_serde="str", batch_size=20, batch_wait=0.1,
                          processing_guarantee="exactly_once")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TOPK_SOURCE": source,
           "TOPK_OUTPUT": output, "TOPK_K": "3"}
    command = [sys.executable, "-m", "kasper_py", "run", "global_topk:app", "--app-dir",
               str(EXAMPLES), "--config", str(config), "--log-format", "console"]

    def done() -> int:
        return sum(o or 0 for o in kafka.committed(name, source, 4).values())

    with internal_topics_deleted(bootstrap, name):
        with (tmp_path / "first.log").open("wb") as log:
            first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: done() > 0, "the first commit", 90)
        finally:
            first.kill()
            first.wait(30)
        assert done() < len(items)  # the kill landed mid-run
        last = subprocess.run([*command, "--until-caught-up"], env=env, capture_output=True,
                              text=True, timeout=180, check=False)
        assert last.returncode == 0, last.stdout[-3000:]

        tops = f"{name}-tops-repartition"
        assert partition_count(bootstrap, tops) == 1
        for topic, count in ((source, 4), (tops, 1)):
            assert kafka.committed(name, topic, count) == ends(bootstrap, topic, count)
        final = kafka.read_all(output)[-1]
        assert [tuple(pair) for pair in json.loads(final.value())] == expected


def test_group_members_wait_out_a_transaction_open_on_their_input(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A transaction left open on the source (a killed upstream's, until the broker
    aborts it) hides its records and holds the partition's visible end below them. Two
    group members run until caught up over a 2-partition source and a 3-partition
    repartition: with every visible view committed they keep running while it is open;
    once it commits they count its view too and end, every partition of both topics
    committed at its end, each update seen once. Meanwhile `kasper app describe
    --members` names the member holding each partition of the repartition."""
    source = new_topic("fan-open-views", partitions=2)
    output = new_topic("fan-open-counts", partitions=2)
    name = unique_name("fan-open")
    expected = produce_views(kafka, source, 40, users=4, sessions=8)
    upstream = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": unique_name("fan-open-upstream")})
    upstream.init_transactions()
    upstream.begin_transaction()
    upstream.produce(source, key=b"s0", value=b"u0,p-open", partition=0)
    upstream.flush()
    configs = [app_config(tmp_path / f"app{i}.toml", "group", name=name,
                          bootstrap_servers=bootstrap, state_dir=str(tmp_path / f"state{i}"),
                          key_serde="str", value_serde="str", batch_size=20, batch_wait=0.1,
                          processing_guarantee="exactly_once") for i in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PAGEVIEWS_SOURCE": source,
           "PAGEVIEWS_OUTPUT": output, "PAGEVIEWS_REPARTITION_PARTITIONS": "3"}
    repartition = f"{name}-by-user-repartition"
    with internal_topics_deleted(bootstrap, name):
        run = Run(configs, [tmp_path / f"member{i}.log" for i in range(2)],
                  [["--assignment", "group"]] * 2, env, "--until-caught-up")
        try:
            wait_for(lambda: visible_done(kafka, name, bootstrap, {source: 2, repartition: 3}),
                     "the visible records committed", 90)
            time.sleep(3)  # a member that took this for caught up would have ended
            assert [p.poll() for p in run.processes] == [None, None], run.text()
            assert holders(configs[0], env, repartition) == {"0", "1", "2"}
        finally:
            upstream.commit_transaction()
        assert run.finish() == [0, 0], run.text()
        for topic, count in ((source, 2), (repartition, 3)):
            committed = {p: o or 0 for p, o in kafka.committed(name, topic, count).items()}
            assert committed == ends(bootstrap, topic, count)
        expected["u0"] += 1
        seen = updates(kafka, output)
        assert set(seen.values()) == {1}, {u: n for u, n in seen.items() if n != 1}
        assert set(seen) == {(user, n) for user, count in expected.items()
                             for n in range(1, count + 1)}


def test_kasper_query_routes_a_key_by_its_stages_own_partition_count(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """The counts table of the page-view app's second stage reads a one-partition
    repartition of a 4-partition source: `kasper query` finds each user's count in that
    partition, where the largest count (4) would send three of them to partitions 1-3."""
    from kasper_py.query import partition_for

    source, output = new_topic("qfan-views", partitions=4), new_topic("qfan-counts")
    name = unique_name("qfan")
    views = produce_views(kafka, source, 120, users=12, sessions=40)
    expected = {user: count for user, count in views.items()  # misrouted by 4 partitions
                if partition_for(user.encode(), 4, "murmur2")}
    expected = dict(sorted(expected.items())[:3])
    assert len(expected) == 3
    port = free_port()
    config = write_config(tmp_path / "app.toml", name=name, bootstrap_servers=bootstrap,
                          state_dir=str(tmp_path / "state"), key_serde="str",
                          value_serde="str", batch_wait=0.1, query_port=port)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PAGEVIEWS_SOURCE": source,
           "PAGEVIEWS_OUTPUT": output, "PAGEVIEWS_REPARTITION_PARTITIONS": "1"}
    repartition = f"{name}-by-user-repartition"
    with internal_topics_deleted(bootstrap, name):
        run = Run([config], [tmp_path / "run.log"], [[]], env)
        try:
            wait_for(lambda: len(kafka.read_all(output)) == 120, "every count update", 90)
            answers = {user: subprocess.run(
                [sys.executable, "-m", "kasper_py", "query", "--url",
                 f"http://127.0.0.1:{port}", "counts", user], env=env, capture_output=True,
                text=True, timeout=60, check=False) for user in expected}
        finally:
            run.kill()
        assert partition_count(bootstrap, repartition) == 1
    assert {user: (a.returncode, a.stdout, a.stderr) for user, a in answers.items()} == {
        user: (0, f"{count}\n", "") for user, count in expected.items()}, run.text()


def visible_done(kafka: Any, group: str, bootstrap: str, counts: dict[str, int]) -> bool:
    """Every partition of the topics of ``counts`` committed at its visible end (its
    last stable offset; past nothing: a transaction left open holds it)."""
    return all({p: o or 0 for p, o in kafka.committed(group, topic, count).items()}
               == ends(bootstrap, topic, count) for topic, count in counts.items())


def holders(config: Path, env: dict[str, str], topic: str) -> set[str]:
    """``kasper app describe --members --json`` of the group: which member holds each
    partition of ``topic`` (every one held, by one of the two members; their numbers)."""
    group = config.with_name("describe.toml")
    group.write_text(config.read_text().replace("\n[", '\nassignment = "group"\n[', 1))
    described = subprocess.run(
        [sys.executable, "-m", "kasper_py", "app", "describe", APP, "--app-dir", str(HERE),
         "--config", str(group), "--members", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert described.returncode == 0, described.stderr[-2000:]
    members = json.loads(described.stdout)["partitions"][topic]["members"]
    assert "-" not in members.values() and len(set(members.values())) <= 2, members
    return set(members)
