"""The live pipeline on Spark Structured Streaming (``kasper_py.stream``) on a real
broker: ``kasper stream`` on the standalone cluster (parity with the live loop on 200k
messages of the reach example, a driver killed with -9 and restarted from its
checkpoint), and on a local[2] session the handoff loop -> stream -> loop on one group
with the refusals on either side, and what is refused at start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import reprocess_processors as procs
import test_spark_cluster
from conftest_stores import free_port, wait_for
from test_reprocess import config, run_live
from test_spark_cluster import EXAMPLES, driver_env, reach_output

from kasper_py import Config, StreamError
from kasper_py.exceptions import AlreadyRunningError
from kasper_py.kafka.offsets import CommitNote
from kasper_py.reprocess._kafka import KafkaFacts
from kasper_py.stack import redis_url
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.stream import stream

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
import reach

pytest_plugins = ["conftest_spark"]
pytestmark = [pytest.mark.integration, pytest.mark.spark]

reach_topics = test_spark_cluster.reach_topics  # the reach example's topics
PARITY_TWEETS = 200_000


def _scrape(port: int) -> dict[str, float]:
    """A driver's ``/metrics``: sample name with labels -> value (empty while it does not
    answer yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    samples = (line.rsplit(" ", 1) for line in text.splitlines()
               if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def notes(cfg: Config) -> list[CommitNote | None]:
    facts = KafkaFacts(cfg)
    try:
        return facts.commit_notes(facts.input_keys())
    finally:
        facts.close()


def test_reach_through_kasper_stream_on_the_cluster_matches_the_live_loop(  # noqa: PLR0917
        spark_master, bootstrap, unique_name, kafka, reach_topics, tmp_path) -> None:
    """200k tweets of the reach example through the live loop, then through
    ``kasper stream reach:ReachProcessor`` on the standalone cluster: the same output
    multiset, every tweet's reach its user's follower count. The driver's /metrics counts
    every input row; on SIGTERM the command stops, says how many messages and
    micro-batches it streamed, and the group's offsets are at the input's end with a
    stopped note of the stream."""
    prefix, followers = reach_topics(PARITY_TWEETS)
    topics = (prefix + reach.TWEETS, prefix + reach.FOLLOWERS)
    cfgs = {kind: Config(name=unique_name(kind), bootstrap_servers=bootstrap,
                         input_topics=topics, key_serde="str", value_serde="json",
                         batch_size=PARITY_TWEETS + 50, batch_wait=3.0, max_latency=None)
            for kind in ("live", "stream")}
    # The loop's first batch holds each partition's followers and tweets together (a
    # tweet polled before its user's count would get reach 0: the example's caveat).
    run_live(cfgs["live"], partial(reach.ReachProcessor, prefix=prefix))
    live = reach_output(kafka, prefix)
    assert sum(live.values()) == PARITY_TWEETS
    assert all(json.loads(value)["reach"] == followers[key] for _, key, value in live)

    name, port = cfgs["stream"].name, free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "kasper_py", "stream", "reach:ReachProcessor",
         "--app-dir", str(EXAMPLES), "--name", name, "--bootstrap-servers", bootstrap,
         "--input-topics", ",".join(topics), "--master", spark_master, "--trigger", "0.5",
         "--metrics-port", str(port), "--checkpoint", str(tmp_path / "cp")],
        env=driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    label = f'{{processor="{name}"}}'
    try:
        wait_for(lambda: child.poll() is not None or _scrape(port).get(
            f"kasper_stream_input_rows_total{label}") == PARITY_TWEETS + 50,
            "every input row in the driver's /metrics", timeout=400)
        scraped = _scrape(port)
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the driver's Spark JVM with it, if left
    assert child.returncode == 0, stderr[-3000:]
    assert "stream_watch_failed" not in stderr  # every progress event read
    batches = int(scraped[f"kasper_stream_batches_total{label}"])
    assert f"streamed {PARITY_TWEETS + 50} messages in {batches} micro-batches; " \
           f"group {name} resumes at " in stdout
    assert reach_output(kafka, prefix) == live + live
    assert sum(kafka.committed(name, topics[0], 2).values()) == PARITY_TWEETS
    found = [n for n in notes(cfgs["stream"]) if n is not None]
    assert found and all(n.state == "stopped" and n.by_stream for n in found)


def test_handoff_loop_stream_loop_processes_every_input_once(bootstrap, new_topic, kafka,
                                                             spark, tmp_path) -> None:
    """Loop, then stream (several micro-batches), then loop again on one group: every
    input reaches the output exactly once and the committed offsets reach the end. The
    loop refuses to start while the stream runs; the stream refuses to start over a
    live loop's recent note."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    group = f"{source}-group"
    cfg = config(bootstrap, group, [source], batch_size=100)
    factory = partial(procs.Tagged, output=output)
    for part in range(3):
        kafka.produce(source, [b"p%d-%d" % (part, i) for i in range(300)], partition=0)
        kafka.produce(source, [b"q%d-%d" % (part, i) for i in range(300)], partition=1)
        if part == 1:
            run = stream(cfg, factory, checkpoint=str(tmp_path / "cp"), spark=spark,
                         trigger=0.2, kafka_options={"maxOffsetsPerTrigger": "200"})
            try:
                with pytest.raises(AlreadyRunningError, match=r"a stream \(kasper stream\) is "
                                   r"running partitions all .* streaming on"):
                    run_live(cfg, factory)
                assert run.await_caught_up(timeout=180)
            finally:
                run.stop()
            assert len([b for b in run.batches if b.messages]) >= 3
            assert kafka.committed(group, source, 2) == {0: 600, 1: 600}
        else:
            run_live(cfg, factory)
    values = Counter(m.value().rsplit(b"|", 1)[1] for m in kafka.read_all(output))
    assert len(values) == 1800 and set(values.values()) == {1}
    assert kafka.committed(group, source, 2) == {0: 900, 1: 900}
    # a live loop's running note from another process: the stream refuses
    facts = KafkaFacts(cfg)
    try:
        facts.commit({(source, 0): 900, (source, 1): 900},
                     CommitNote("running", time.time(), socket.gethostname(),
                                os.getppid()).encode())
    finally:
        facts.close()
    with pytest.raises(AlreadyRunningError, match=r"being processed by a live loop"):
        stream(cfg, factory, checkpoint=str(tmp_path / "cp2"), spark=spark)
    # the first checkpoint is older than the loop's commits: resuming it is refused
    with pytest.raises(StreamError, match=r"holds an earlier run's offsets, but a live loop"):
        stream(cfg, factory, checkpoint=str(tmp_path / "cp"), spark=spark, force=True)


def test_driver_killed_then_restarted_loses_nothing_and_counts_exactly(  # noqa: PLR0917
        spark_master, bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """``kasper stream`` on the standalone cluster (its driver) is killed with -9 after a
    few micro-batches and restarted from its checkpoint: every input is in the output,
    duplicates within one micro-batch (400 offsets), the effectively-once Redis counts
    exact, the group at the end and the command's summary saying so."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    group = unique_name("killed")
    for p in range(2):
        kafka.produce(source, [b"w%d-%d" % (i % 7, i) for i in range(2000)], partition=p)
    here = Path(__file__).parent
    args = [sys.executable, "-m", "kasper_py", "stream",
            f"{procs.__name__}:tagged_count_to_out_topic",
            "--stores", f"{procs.__name__}:exact_count_stores", "--app-dir", str(here),
            "--name", group, "--bootstrap-servers", bootstrap, "--input-topics", source,
            "--batch-size", "200", "--trigger", "0.2", "--master", spark_master,
            "--kafka-option", "maxOffsetsPerTrigger=400",
            "--checkpoint", str(tmp_path / "cp"), "--until-caught-up"]
    # the command ships the processors' module (under --app-dir) to Spark's workers
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_commit(kafka, group, source, child)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    done = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"group {group} resumes at {source}[0] 2000, {source}[1] 2000" in done.stdout
    assert kafka.committed(group, source, 2) == {0: 2000, 1: 2000}
    inputs = Counter(tuple(m.value().split(b"|")[1:3]) for m in kafka.read_all(output))
    assert len(inputs) == 4000  # (partition, offset) of every input
    assert sum(inputs.values()) - 4000 <= 400
    client = redis.Redis.from_url(redis_url())
    counts: Counter[str] = Counter()
    for p in range(2):
        for i in range(2000):
            counts[f"{p}/w{i % 7}"] += 1
    stored = {f"{p}/w{w}": int(client.get(f"{group}/{procs.STORE}/{p}/w{w}") or 0)
              for p in range(2) for w in range(7)}
    assert stored == dict(counts)


def _wait_for_commit(kafka: Any, group: str, source: str, child: subprocess.Popen[bytes]
                     ) -> None:
    """Until the stream committed some but not all of the input."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and child.poll() is None:
        committed = kafka.committed(group, source, 2)
        if any(committed.values()) and sum(v or 0 for v in committed.values()) > 800:
            return
        time.sleep(0.2)
    pytest.fail(f"the stream committed nothing in time (exit {child.poll()})")


def test_refused_at_start_with_clear_errors(bootstrap, new_topic, tmp_path) -> None:
    """A RocksDB table, a bad trigger or starting, and master with a session are refused
    before Spark or Kafka is used, saying what is wrong."""
    cfg = config(bootstrap, "refused", [new_topic("in")])
    factory = partial(procs.Tagged, output="none")
    checkpoint = str(tmp_path / "cp")
    with pytest.raises(StreamError, match=r"store 'words' is a RocksDB table, which "
                       r"streaming does not support: its state lives in files on one machine"):
        stream(cfg, factory, checkpoint=checkpoint, stores=[RocksDBTable("words")])
    with pytest.raises(StreamError, match=r"trigger must be a positive number of seconds, "
                       r"got 0"):
        stream(cfg, factory, checkpoint=checkpoint, trigger=0)
    with pytest.raises(StreamError, match=r"starting must be 'group', 'earliest' or 'latest', "
                       r"got 'now'"):
        stream(cfg, factory, checkpoint=checkpoint, starting="now")  # type: ignore[arg-type]
    with pytest.raises(StreamError, match=r"pass either master or spark"):
        stream(cfg, factory, checkpoint=checkpoint, master="local[2]", spark=object())
    with pytest.raises(StreamError, match=r"checkpoint must name a directory"):
        stream(cfg, factory, checkpoint=" ")
