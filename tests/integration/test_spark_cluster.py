"""The stack's Spark standalone cluster (`kasper stack up spark`): a master and two
workers as processes of their own, `kasper reprocess` of the reach example on it
against local[2], a worker killed with -9 mid-job and mid-stream (`kasper stream`),
and `down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import AdminClient, Consumer

pytest.register_assert_rewrite("conftest_spark", "conftest_stores")
from conftest_spark import SPARK, SparkCluster, start_cluster, stop_cluster  # noqa: E402
from conftest_stores import wait_for  # noqa: E402

from kasper_py.stack._components import spark_master_state  # noqa: E402

pytest_plugins = ["conftest_spark"]
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(900)]

HERE = Path(__file__).parent
EXAMPLES = HERE.parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import reach  # noqa: E402

TWEETS = 20_000
SLOW_TWEETS = 40_000


@pytest.fixture
def reach_topics(bootstrap: str, unique_name: Callable[[str], str]
                 ) -> Iterator[Callable[[int], tuple[str, dict[str, int]]]]:
    """Makes the reach example's three topics (2 partitions) under a fresh prefix, with
    that many sample tweets; returns the prefix and each user's follower count. The
    topics are deleted after the test."""
    prefixes: list[str] = []

    def make(tweets: int) -> tuple[str, dict[str, int]]:
        prefixes.append(unique_name(f"reach{len(prefixes)}") + "-")
        return prefixes[-1], reach.produce_sample(bootstrap, prefixes[-1], 2, tweets)

    yield make
    topics = [prefix + name for prefix in prefixes
              for name in (reach.TWEETS, reach.FOLLOWERS, reach.REACH)]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the futures are done
    for future in admin.delete_topics(topics).values():
        future.result(30)


def reach_command(runner: str, prefix: str, bootstrap: str, master: str, *extra: str
                  ) -> list[str]:
    """`python -m kasper_py.<runner>` (reprocess or stream) of the reach example over the
    topics of ``prefix``, as processor (and group) ``<prefix>job``."""
    return [sys.executable, "-m", f"kasper_py.{runner}", "reach:ReachProcessor",
            "--app-dir", str(EXAMPLES),
            "--name", prefix + "job", "--bootstrap-servers", bootstrap,
            "--input-topics", f"{prefix}{reach.TWEETS},{prefix}{reach.FOLLOWERS}",
            "--master", master, "--log-format", "json", *extra]


def driver_env() -> dict[str, str]:
    """The reach example's serdes; the rest (PYTHONPATH, KASPER_STACK_DIR) as given."""
    return {**os.environ, "KASPER_KEY_SERDE": "str", "KASPER_VALUE_SERDE": "json"}


def run_driver(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, env=driver_env(),
                          timeout=600, check=False, cwd=HERE)


def reach_output(kafka: Any, prefix: str) -> Counter[tuple[int, str, str]]:
    """Every (partition, key, value) of the reach topic, with its multiplicity."""
    return Counter((m.partition(), m.key().decode(), m.value().decode())
                   for m in kafka.read_all(prefix + reach.REACH))


def test_the_cluster_is_a_master_and_two_alive_workers_in_processes_of_their_own(
        spark_cluster: SparkCluster) -> None:
    """Three running processes with distinct pids (the Master class and two Workers),
    and the master's /json/ lists both workers ALIVE on their configured ports."""
    if spark_cluster.settings is None:
        pytest.skip("$KASPER_SPARK_MASTER names an external cluster")
    pids = spark_cluster.pids()
    assert None not in pids.values() and len(set(pids.values())) == 3, pids
    main_classes = [_main_class(pid) for pid in pids.values() if pid is not None]
    assert main_classes == ["org.apache.spark.deploy.master.Master",
                            "org.apache.spark.deploy.worker.Worker",
                            "org.apache.spark.deploy.worker.Worker"]
    state = spark_master_state(spark_cluster.settings)
    assert state is not None and state["status"] == "ALIVE" and state["aliveworkers"] == 2
    first = spark_cluster.settings.spark_worker_port
    assert sorted(w["port"] for w in state["workers"] if w["state"] == "ALIVE") == [
        first, first + 1]
    assert state["url"] == spark_cluster.master


def _main_class(pid: int) -> str:
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return next(a for a in arguments if a.startswith("org.apache.spark.deploy."))


def test_cli_reprocess_of_reach_on_the_cluster_matches_local(
        spark_master: str, bootstrap: str, kafka: Any,
        reach_topics: Callable[[int], tuple[str, dict[str, int]]]) -> None:
    """`kasper reprocess reach:ReachProcessor --master spark://...` produces exactly what
    the same command on local[2] produced: the reach topic holds each local[2] message
    twice after both runs, and every tweet's reach is its user's follower count."""
    prefix, followers = reach_topics(TWEETS)
    local = run_driver(reach_command("reprocess", prefix, bootstrap, "local[2]"))
    assert local.returncode == 0, local.stderr[-3000:]
    on_local = reach_output(kafka, prefix)
    cluster = run_driver(reach_command("reprocess", prefix, bootstrap, spark_master))
    assert cluster.returncode == 0, cluster.stderr[-3000:]
    assert f"reprocessed {TWEETS + 50} messages" in cluster.stdout
    assert sum(on_local.values()) == TWEETS
    assert reach_output(kafka, prefix) == on_local + on_local
    summary = reach.summarise(bootstrap, prefix + reach.REACH, 2 * TWEETS,
                              followers=followers)
    assert summary["reach_messages"] == 2 * TWEETS and summary["wrong_reach"] == 0


def test_a_worker_killed_mid_job_fails_it_cleanly_and_a_rerun_loses_nothing(
        own_spark_cluster: SparkCluster, bootstrap: str, kafka: Any,
        reach_topics: Callable[[int], tuple[str, dict[str, int]]]) -> None:
    """kill -9 of a worker while a reach job runs on it (slowed down: one message per
    batch, so every message costs a produce round trip): Spark reschedules the
    lost task on the other worker (a retried attempt, refused in the task) or reruns
    the stage whose shuffle output was lost (new tasks at attempt 0, refused by the
    driver after the job from Spark's stage attempts): either way the job exits 1 saying
    Spark retried tasks, and hands nothing off. A rerun on the one worker left
    processes every message and hands off; `up spark` then brings back only the killed
    worker."""
    (prefix, _), cluster = reach_topics(SLOW_TWEETS), own_spark_cluster
    assert cluster.settings is not None
    before = cluster.pids()
    command = reach_command("reprocess", prefix, bootstrap, cluster.master, "--handoff",
                                "--batch-size", "1")
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=driver_env(), cwd=HERE)
    try:
        wait_for(lambda: driver.poll() is not None
                 or _produced(bootstrap, prefix + reach.REACH) > 0,
                 "the job's first output", timeout=300)
        assert driver.poll() is None, "the job ended before a worker could be killed"
        os.kill(before["spark-worker-1"] or 0, signal.SIGKILL)
        _, stderr = driver.communicate(timeout=600)
    finally:
        driver.kill()
    assert driver.returncode == 1, stderr[-3000:]
    assert "Spark retried task" in stderr, stderr[-3000:]
    assert kafka.committed(prefix + "job", prefix + reach.TWEETS, 2) == {0: None, 1: None}

    rerun = run_driver(reach_command("reprocess", prefix, bootstrap, cluster.master, "--handoff"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    produced = [json.loads(value) for _, _, value in reach_output(kafka, prefix)]
    assert {r["tweet_id"] for r in produced} == set(range(SLOW_TWEETS))
    committed = kafka.committed(prefix + "job", prefix + reach.TWEETS, 2)
    assert sum(committed.values()) == SLOW_TWEETS

    after = start_cluster(cluster.settings).pids()
    assert after["spark-master"] == before["spark-master"]
    assert after["spark-worker-2"] == before["spark-worker-2"]
    assert after["spark-worker-1"] not in (None, before["spark-worker-1"])


def test_a_worker_killed_mid_stream_then_a_restart_loses_nothing(
        own_spark_cluster: SparkCluster, bootstrap: str, kafka: Any, tmp_path: Path,
        reach_topics: Callable[[int], tuple[str, dict[str, int]]]) -> None:
    """kill -9 of a worker while `kasper stream` of the reach example runs on the
    cluster (slowed down: one message per turn, 2000 offsets per micro-batch), once the
    group has a committed micro-batch: the query survives. The driver loses that
    worker's executor, Spark runs its tasks again on the other worker (streaming allows
    task retries, spark.task.maxFailures=4), and the command exits 0 having streamed
    every message, no progress event failing to read. A restart from the checkpoint
    loses nothing and streams nothing again: every tweet is in the output and the group
    at the input's end. `up spark` then brings back only the killed worker."""
    (prefix, _), cluster = reach_topics(TWEETS), own_spark_cluster
    assert cluster.settings is not None
    before = start_cluster(cluster.settings).pids()  # both workers, whatever ran before
    group, tweets = prefix + "job", prefix + reach.TWEETS
    command = reach_command("stream", prefix, bootstrap, cluster.master, "--batch-size", "1",
                            "--trigger", "0.2", "--kafka-option", "maxOffsetsPerTrigger=2000",
                            "--checkpoint", str(tmp_path / "cp"), "--until-caught-up")
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=driver_env(), cwd=HERE, start_new_session=True)
    try:
        wait_for(lambda: driver.poll() is not None
                 or any(kafka.committed(group, tweets, 2).values()),
                 "the stream's first committed micro-batch", timeout=300)
        assert driver.poll() is None, "the stream ended before a worker could be killed"
        at_kill = kafka.committed(group, tweets, 2)
        os.kill(before["spark-worker-1"] or 0, signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=600)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, stderr[-3000:]
    assert sum(at_kill.values()) < TWEETS
    assert "Lost executor" in stderr and "stream_watch_failed" not in stderr
    assert f"streamed {TWEETS + 50} messages in " in stdout
    restart = run_driver(command)
    assert restart.returncode == 0, restart.stderr[-3000:]
    assert "streamed 0 messages in " in restart.stdout
    produced = [json.loads(value) for _, _, value in reach_output(kafka, prefix)]
    assert {r["tweet_id"] for r in produced} == set(range(TWEETS))
    assert sum(kafka.committed(group, tweets, 2).values()) == TWEETS
    after = start_cluster(cluster.settings).pids()
    assert after["spark-worker-2"] == before["spark-worker-2"]
    assert after["spark-worker-1"] not in (None, before["spark-worker-1"])


def _produced(bootstrap: str, topic: str) -> int:
    """Messages in ``topic`` now (the sum of its partitions' high watermarks)."""
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kasper-tests-watermarks"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(2))
    finally:
        consumer.close()


def test_down_stops_the_master_and_both_workers(own_spark_cluster: SparkCluster) -> None:
    """`down spark` stops all three processes: their pids are gone and status says
    stopped. (Their ports are freed with them; the master's is not probed, since another
    process, such as a Spark driver of a test running alongside, may take it at once.)"""
    assert own_spark_cluster.settings is not None
    # `up` again: an earlier test of the module may have killed a worker.
    pids = start_cluster(own_spark_cluster.settings).pids()
    assert None not in pids.values(), pids
    stop_cluster(own_spark_cluster.settings)
    assert own_spark_cluster.pids() == dict.fromkeys(SPARK)
    assert all(_gone(pid) for pid in pids.values() if pid is not None)


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie not yet reaped by init counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
