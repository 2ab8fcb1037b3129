"""``Deduplicator`` under exactly-once on a real broker, killed with -9: every id is
sent exactly once (as a read_committed reader sees the output), however the kills
cut the run, and a restart after the input is done sends nothing more."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import kill_randomly_then_finish  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delete_changelogs")]
WORKER = Path(__file__).parent / "dedup_worker.py"


def test_each_id_is_sent_once_across_kills(bootstrap, new_topic, kafka, unique_name,
                                           tmp_path) -> None:
    """3,000 ids, each sent three times (the repeats spread over the input), two
    partitions; SIGKILL at three random moments, then run to the end: each id's value
    is read exactly once, its first occurrence's (``<id>#0``)."""
    partitions, ids, kills = 2, 3000, 3
    topic, output = new_topic("dup-in", partitions=partitions), new_topic("dup-out", 2)
    name = unique_name("dedup-kill")
    records = [(f"id{i}".encode(), f"id{i}#{copy}".encode())
               for copy in range(3) for i in range(ids)]
    kafka.produce(topic, records)
    args = [sys.executable, str(WORKER), bootstrap, name, topic, output, str(tmp_path)]
    committed = lambda: sum(  # noqa: E731 - read after each kill
        o or 0 for o in kafka.committed(name, topic, partitions).values())
    kill_randomly_then_finish(args, kills, committed, len(records))
    assert committed() == len(records)
    sent = Counter(m.value() for m in kafka.read_all(output))
    assert sent == Counter(f"id{i}#0".encode() for i in range(ids))
    subprocess.run([*args, "--until-caught-up"], check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    assert Counter(m.value() for m in kafka.read_all(output)) == sent
