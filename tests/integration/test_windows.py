"""Windows on the real broker: the page-view count of examples/pageviews_windowed.py,
exactly-once on RocksDB, killed with -9 several times and then run with its folder
lost, sends exactly the final counts a run without a crash sends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import kill_randomly_then_finish  # isort: skip  # noqa: E402

from kasper_py import Config  # noqa: E402
from kasper_py.stores.memory import MemoryTable  # noqa: E402
from kasper_py.testing import ProcessorDriver, make_message  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
import pageviews_windowed  # noqa: E402 - from the examples folder

pytest_plugins = ["conftest_stores"]
pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("windows_worker.py")
VIEWS, SPLIT = 40_000, 30_000


def without_a_crash(messages: list[Any]) -> Counter[tuple[str, int, int]]:
    """The final counts the processor sends over ``messages`` (read back from the input
    topic, so per partition in offset order), run in memory without a crash."""
    config = Config(name="no-crash", bootstrap_servers="in-memory:0", input_topics=["views"],
                    key_serde="str", value_serde="json")
    driver = ProcessorDriver(lambda c: pageviews_windowed.PageViewsPerMinute(c, "out"),
                             config=config, stores=[MemoryTable("views")])
    by_partition: dict[int, list[Any]] = {}
    for m in messages:
        by_partition.setdefault(m.partition(), []).append(m)
    for partition, records in by_partition.items():
        driver.process([make_message("views", m.value(), m.key(), partition=partition,
                                     offset=m.offset(), timestamp=m.timestamp()[1])
                        for m in records], encoded=True)
    return Counter((v["user"], v["start"], v["views"]) for _, v in driver.outputs("out"))


def test_kill_minus_nine_and_a_lost_folder_send_what_a_clean_run_sends(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path, delete_changelogs: None) -> None:
    """Kill the exactly-once loop at random three times over the first 30,000 views and
    let it finish; delete its RocksDB folder; write the rest (late and closing views
    too) and run it again, restoring the windows from the changelog. The committed
    output holds each closed minute's count once, equal to a run without a crash."""
    topic, output = new_topic("views", partitions=2), new_topic("counts", partitions=2)
    name, state = unique_name("win-kill"), tmp_path / "state"
    views = pageviews_windowed.sample_views(VIEWS, pageviews_windowed.sample_start(VIEWS))
    records = [(user.encode(), f'"{page}"'.encode(), at) for user, at, page in views]
    kafka.produce(topic, records[:SPLIT])
    args = [sys.executable, str(WORKER), bootstrap, name, topic, output, str(state)]

    def committed() -> int:
        return sum(o or 0 for o in kafka.committed(name, topic, 2).values())

    kill_randomly_then_finish(args, 3, committed, SPLIT)
    assert committed() == SPLIT
    shutil.rmtree(state)
    kafka.produce(topic, records[SPLIT:])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([*args, "--until-caught-up"], env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)

    assert committed() == len(records)
    sent = Counter((v["user"], v["start"], v["views"]) for v in
                   (json.loads(m.value()) for m in kafka.read_all(output)))
    expected = without_a_crash(kafka.read_all(topic))
    assert sent == expected
    assert sum(expected.values()) == len(pageviews_windowed.expected_counts(views))
