"""The way back after a promotion, through ``kasper standby release`` and the process's
admin endpoint, on the real broker: the promoting process commits the partition with a
"released" note and stops running it, its old owner restarted on it at once is not
refused, restores only the changelog's tail from its own folder and counts on, and the
promoting process keeps the partition warm again. Offsets, table and changelog exact."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kasper_py.kafka.topics import changelog_topic

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_standby import (  # isort: skip  # noqa: E402
    keyed, level, read_table, run, stop, table_metric)
from test_cli import kasper_command  # isort: skip  # noqa: E402
from test_standby_promote import EOS, promote, standby  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]


def release(admin: int, partitions: str) -> subprocess.CompletedProcess[str]:
    """``kasper standby release`` of ``partitions`` at the admin port ``admin``."""
    return standby("release", admin, partitions)


def lag_rows(bootstrap: str, name: str, topic: str) -> dict[int, list[str]]:
    """``kasper lag``'s MEMBER (and STANDBYS, when any) of each partition."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    out = subprocess.run([*kasper_command(), "lag", "--name", name, "--bootstrap-servers",
                          bootstrap, "--input-topics", topic], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return {int(row[1]): row[3:] for row in map(str.split, out.splitlines()[1:3])}


def described(bootstrap: str, name: str, topic: str, folder: Path) -> list[str]:
    """``kasper app describe --members``'s lines about the partitions of ``topic``, for
    an App reading it (written to ``folder``) under the name ``name``."""
    (folder / "describe_app.py").write_text(
        "from kasper_py.dsl import Builder\n"
        "builder = Builder('describe', stores='memory')\n"
        f"builder.stream({topic!r}).group_by_key().count('counts')\n"
        "app = builder.build()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    out = subprocess.run([*kasper_command(), "app", "describe", "describe_app:app",
                          "--app-dir", str(folder), "--name", name, "--members"],
                         env={**env, "KASPER_BOOTSTRAP_SERVERS": bootstrap},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.startswith("    partition")]


def runner(process: subprocess.Popen[bytes]) -> str:
    """How a loop's commit notes name ``process``."""
    return f"pid-{process.pid}@{socket.gethostname()}"


def test_released_partitions_go_back_to_their_returning_owner(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Exactly-once: A owns partition 0, B owns 1 and keeps 0 warm. A stops; B is
    promoted for 0 and counts 20 more keys. Releasing 5 (absent) or 0,1 (all B owns) is
    refused, nothing committed; releasing 0 answers B's committed offset for it. A,
    started again on 0 right away, starts, restores only the 20 changelog records past
    its own folder, and counts 10 more; B keeps 0 warm again, level with A's writes, and
    still runs 1. ``kasper lag`` (and ``kasper app describe --members``, promoted) says
    so: B runs both and keeps nothing warm while promoted; then A runs 0, B keeps it
    warm. Each key's changelog write is there once; A's table is exact."""
    topic, name = new_topic("release", partitions=2), unique_name("release")
    kafka.produce(topic, keyed("k", 100), partition=0)
    kafka.produce(topic, keyed("b", 5), partition=1)
    port_a, port_b, admin = free_port(), free_port(), free_port()
    a_flags = (*EOS, "--input-partitions", "0", "--metrics-port", str(port_a))
    a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log", *a_flags)
    b = run(name, topic, bootstrap, tmp_path / "b", tmp_path / "b.log", *EOS,
            "--input-partitions", "1", "--standby-partitions", "0", "--metrics-port",
            str(port_b), "--admin-port", str(admin))
    try:
        wait_for(lambda: kafka.committed(name, topic, 2) == {0: 100, 1: 5}, "A and B", 60)
        stop(a)
        assert promote(admin, "0").returncode == 0
        kafka.produce(topic, keyed("n", 20), partition=0)
        wait_for(lambda: kafka.committed(name, topic, 2)[0] == 120, "B's turns on 0", 60)
        assert lag_rows(bootstrap, name, topic) == {0: [runner(b)], 1: [runner(b)]}
        assert described(bootstrap, name, topic, tmp_path) == [
            f"partition 0: run by {runner(b)}; warm in -",
            f"partition 1: run by {runner(b)}; warm in -"]
        assert_release_refused(admin)
        assert kafka.committed(name, topic, 2) == {0: 120, 1: 5}
        done = release(admin, "0")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["committed"] == {f"{topic}[0]": 120}
        kafka.produce(topic, keyed("m", 10), partition=0)
        kafka.produce(topic, keyed("c", 3), partition=1)
        a = run(name, topic, bootstrap, tmp_path / "a", tmp_path / "a.log", *a_flags)
        wait_for(lambda: kafka.committed(name, topic, 2) == {0: 130, 1: 8}, "A back", 60)
        assert table_metric(port_a, "last_restore_records", name) == {0: 20}
        wait_for(lambda: level(port_b, name, bootstrap, [0]), "B's copy of 0 level", 30)
        assert "kasper.released" in (tmp_path / "b.log").read_text()
        assert lag_rows(bootstrap, name, topic) == {0: [runner(a), runner(b)],
                                                    1: [runner(b), "-"]}
    finally:
        stop(b)
        stop(a)
    records = [(m.key().decode(), int(m.value())) for m in
               kafka.read_all(changelog_topic(name, "counts")) if m.partition() == 0]
    expected = {(key, 1): 1 for prefix, count in (("k", 100), ("n", 20), ("m", 10))
                for key, _ in keyed(prefix, count)}
    assert Counter(records) == expected
    assert read_table(tmp_path / "a" / name / "counts") == {k: 1 for k, _ in expected}


def assert_release_refused(admin: int) -> None:
    """Releasing partition 5 (absent) or 0,1 (all B owns) exits 5 with the reason."""
    for partitions, said in (("5", "partitions [5] do not exist"),
                             ("0,1", "would own no partition")):
        refused = release(admin, partitions)
        assert (refused.returncode, refused.stdout) == (5, "")
        assert said in refused.stderr
