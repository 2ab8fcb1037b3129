"""A DSL windowed count (``emit="final"``) closes on quiet input through ``kasper run``
on the real broker, without ``--until-caught-up``: records stop, and the last window's
final count still comes while the process runs, from the partition's stream time moved
on by ``KASPER_IDLE_ADVANCE``; a record arriving after that window closed is late."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import kasper_command  # isort: skip
from test_dsl_examples import internal_topics, run_env  # isort: skip  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

START = int(time.time() - 3600) // 2 * 2000
"""The first window's start (event time; a multiple of 2 s), an hour ago: within the
broker's retention, which deletes older records while the test runs."""
AHEAD = 600_000
"""The second window's start after START: never reached by idle advance in the test."""
APP = """from kasper_py.dsl import Builder
from kasper_py.windows import Tumbling

b = Builder("idle-windows")
(b.stream({source!r}).group_by_key().windowed_by(Tumbling(2)).count("counts", emit="final")
    .to_stream().to({sink!r}))
app = b.build()
"""


def test_a_quiet_partitions_last_dsl_window_is_emitted(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Three records in the window [START, START + 2 s), then nothing: its final count
    (3) comes while the process runs, stamped with the window's last instant, and the
    input is committed past the records. Then a record at START + 30 ms (late: its
    window closed) and one at START + 600 s (ahead of the stream time that idle advance
    moves by about 1 s a second, however loaded the machine): only that one's window
    comes, with 1."""
    source, sink, name = new_topic("idlew-in"), unique_name("idlew-out"), unique_name("idlew")
    (tmp_path / "dsl_app.py").write_text(APP.format(source=source, sink=sink))
    kafka.produce(source, [(b'"k"', b'"v"', START + at) for at in (1, 10, 20)], partition=0)
    env = run_env(bootstrap, tmp_path / "state", key_serde="json", value_serde="json",
                  idle_advance="2")
    log = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen(
        [*kasper_command(), "run", "dsl_app:app", "--name", name, "--app-dir", str(tmp_path),
         "--create-topics", "--output-topics", sink], env=env, stderr=log, cwd=tmp_path)
    try:
        assert _outputs(kafka, sink, 1, process=process, folder=tmp_path) == [
            (["k", START, START + 2000], 3, START + 1999)]
        assert _committed(kafka, name, source, 3, process=process, folder=tmp_path) == 3
        kafka.produce(source, [(b'"k"', b'"late"', START + 30), (b'"k"', b'"v"', START + AHEAD)],
                      partition=0)
        assert _outputs(kafka, sink, 2, process=process, folder=tmp_path) == [
            (["k", START, START + 2000], 3, START + 1999),
            (["k", START + AHEAD, START + AHEAD + 2000], 1, START + AHEAD + 1999)]
        assert _committed(kafka, name, source, 5, process=process, folder=tmp_path) == 5
    finally:
        process.terminate()
        process.wait(60)
        log.close()
    assert len(kafka.read_all(sink)) == 2  # nothing more by the stop


def _outputs(kafka: Any, sink: str, count: int, *, process: subprocess.Popen[bytes],
             folder: Path) -> list[tuple[Any, Any, int]]:
    """The sink's records (key, value, timestamp), once ``count`` are there."""
    found = _wait(lambda: kafka.read_all(sink) if process.poll() is None else None,
                  lambda records: len(records) >= count, folder)
    return [(json.loads(m.key()), json.loads(m.value()), m.timestamp()[1]) for m in found]


def _committed(kafka: Any, group: str, source: str, offset: int, *,
               process: subprocess.Popen[bytes], folder: Path) -> int | None:
    """The group's committed offset of ``source``, once it is ``offset``."""
    return _wait(lambda: kafka.committed(group, source)[0] if process.poll() is None else None,
                 lambda committed: committed == offset, folder)


def _wait(read: Callable[[], Any], done: Callable[[Any], bool], folder: Path) -> Any:
    """``read()`` until ``done`` says so (60 s at most); the process must keep running."""
    deadline = time.monotonic() + 60
    while True:
        value = read()
        if value is not None and done(value):
            return value
        assert value is not None, (folder / "stderr.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"still {value!r} after 60 s"
        time.sleep(0.3)
