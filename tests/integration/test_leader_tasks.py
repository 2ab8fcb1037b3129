"""Leader-only tasks across the processes of one app (`kasper run --processes 3`, as
users run it) on the stack's Kafka: one process at a time runs the task, about once
per interval; SIGKILL the leader and another process takes over within the session
timeout plus a margin, while the restarted worker leaves the lead where it is."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kasper_py import Config, Sender, Task, TopicProcessor

sys.path.insert(0, str(Path(__file__).parent))
from leader_module import Ignore  # isort: skip
from test_cli import cli_env, json_lines, kasper_command, wait_for  # isort: skip

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
HANDOVER_LIMIT = 20.0
"""Seconds from the kill to the next run elsewhere: the 6 s session timeout, the
rebalance, a task interval, and a generous margin for a shared machine."""
CLOSE_LIMIT = 5.0
"""Seconds from a leader's close to the next run elsewhere: less than the session
timeout alone, so the lead did not wait for it (a close leaves the group)."""


def runs(kafka: Any, topic: str) -> list[dict[str, int]]:
    """Every run of the task so far, in the order they ran."""
    records = [json.loads(m.value()) for m in kafka.read_all(topic)]
    return sorted(records, key=lambda r: r["at"])


def segments(pids: list[int]) -> list[int]:
    """The pids in the order the lead went to them, one entry per unbroken run."""
    return [pid for i, pid in enumerate(pids) if i == 0 or pids[i - 1] != pid]


def events(log: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(log.read_text(errors="replace")) if e["event"] == name]


@pytest.mark.parametrize("assignment", ["static", "group"])
def test_one_process_runs_the_task_and_the_lead_moves_when_it_is_killed(
        assignment: str, *, bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Three workers of one app with a leader-only task every second: the runs come
    from one process, about one a second; SIGKILL that process and the runs resume from
    another within HANDOVER_LIMIT, the supervisor's restarted worker not taking the lead
    back; over the whole test the runs never interleave between processes (each process
    leads once, in one unbroken stretch) and no two runs fall in one interval."""
    source, sink = new_topic("leader-in", partitions=3), new_topic("leader-out")
    name = unique_name("leader")
    env = cli_env(bootstrap, LEADER_APP=name, LEADER_INPUT_TOPIC=source,
                  LEADER_OUTPUT_TOPIC=sink)
    log = tmp_path / "supervisor.log"
    command = [*kasper_command(), "run", "leader_module:app", "--app-dir", str(HERE),
               "--processes", "3", "--assignment", assignment, "--batch-wait", "0.2"]
    with log.open("wb") as err:
        supervisor = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: len(runs(kafka, sink)) >= 6, "six runs of the leader task", 45)
        window = runs(kafka, sink)
        leader = window[0]["pid"]
        assert {r["pid"] for r in window} == {leader}, window
        seconds = (window[-1]["at"] - window[0]["at"]) / 1000
        assert seconds * 0.5 <= len(window) - 1 <= seconds * 1.5 + 1, window

        os.kill(leader, signal.SIGKILL)
        killed_at = time.time() * 1000
        wait_for(lambda: any(r["pid"] != leader for r in runs(kafka, sink)),
                 "a run from another process", HANDOVER_LIMIT + 10)
        successor = next(r for r in runs(kafka, sink) if r["pid"] != leader)
        assert (successor["at"] - killed_at) / 1000 < HANDOVER_LIMIT, successor
        wait_for(lambda: len(events(log, "kasper.worker_started")) == 4,
                 "the killed worker to be restarted")
        restarted = events(log, "kasper.worker_started")[-1]["pid"]
        wait_for(lambda: any(e["pid"] == restarted
                             for e in events(log, "kasper.leader_electing")),
                 "the restarted worker to join the election")
        settled = len(runs(kafka, sink))
        wait_for(lambda: len(runs(kafka, sink)) >= settled + 4, "four more runs")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(60)
    assert code == 0, log.read_text()[-3000:]
    every = runs(kafka, sink)
    assert segments([r["pid"] for r in every]) == [leader, successor["pid"]], every
    gaps = [(b["at"] - a["at"]) / 1000 for a, b in itertools.pairwise(every)]
    assert min(gaps) > 0.25, every
    elected = [e["pid"] for e in events(log, "kasper.leader_elected")]
    assert elected == [leader, successor["pid"]], elected


def test_a_closed_leader_hands_the_lead_over_without_waiting_for_its_session(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str]) -> None:
    """Two loops of one processor name on partitions 0 and 1 (two `kasper run
    --input-partitions`), in threads, with a leader-only task every 0.5 s: one runs it;
    closing that loop (SIGTERM's path) moves the runs to the other within CLOSE_LIMIT,
    under the 6 s session timeout; the runs never interleave."""
    source, sink = new_topic("leader-in", partitions=2), new_topic("leader-out")
    name = unique_name("leader-close")

    def loop(who: str, partition: int) -> TopicProcessor:
        def tick(now: int, sender: Sender) -> None:
            sender.send(sink, json.dumps({"pid": who, "at": now}).encode(), b"leader")
        config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                        input_partitions=[partition], batch_wait=0.1)
        return TopicProcessor(config, Ignore, tasks=[Task(tick, every=0.5, on_leader=True)])

    loops = {"a": loop("a", 0), "b": loop("b", 1)}
    for processor in loops.values():
        threading.Thread(target=processor.run_loop, daemon=True).start()
    try:
        wait_for(lambda: len(runs(kafka, sink)) >= 4, "four runs of the leader task", 30)
        first = runs(kafka, sink)[0]["pid"]
        other = "b" if first == "a" else "a"
        closed_at = time.time() * 1000
        loops[first].close(timeout=30)
        wait_for(lambda: any(r["pid"] == other for r in runs(kafka, sink)),
                 "a run from the other loop", 20)
        successor = next(r for r in runs(kafka, sink) if r["pid"] == other)
        assert (successor["at"] - closed_at) / 1000 < CLOSE_LIMIT, successor
    finally:
        for processor in loops.values():
            processor.close(timeout=30)
    assert segments([r["pid"] for r in runs(kafka, sink)]) == [first, other]


def test_a_one_time_leader_task_runs_once_in_one_of_three_processes(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`kasper run --processes 3` of an app whose leader-only task is `once=True`: it
    runs once, in one process (the one elected), and not again while they run on."""
    source, sink = new_topic("leader-in", partitions=3), new_topic("leader-out")
    env = cli_env(bootstrap, LEADER_APP=unique_name("leader-once"),
                  LEADER_INPUT_TOPIC=source, LEADER_OUTPUT_TOPIC=sink, LEADER_ONCE="1")
    log = tmp_path / "supervisor.log"
    command = [*kasper_command(), "run", "leader_module:app", "--app-dir", str(HERE),
               "--processes", "3", "--batch-wait", "0.2"]
    with log.open("wb") as err:
        supervisor = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: len(runs(kafka, sink)) >= 1, "the one-time task's run", 45)
        time.sleep(3)  # the processes turn on: none runs it again
        [run] = runs(kafka, sink)
        elected = [e["pid"] for e in events(log, "kasper.leader_elected")]
        assert elected == [run["pid"]], elected
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(60)
    assert code == 0, log.read_text()[-3000:]
    assert len(runs(kafka, sink)) == 1
