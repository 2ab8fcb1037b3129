"""``Config.idle_advance`` through ``kasper run`` on the real broker (no
``--until-caught-up``): records stop, and the last window's final count still comes,
from a stream-time timer whose stream time moved on the quiet partition."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


def test_an_idle_partitions_final_window_is_emitted(bootstrap, new_topic, kafka, unique_name,
                                                    tmp_path) -> None:
    """Three records in one 2 s window, then nothing: with KASPER_IDLE_ADVANCE=2 the
    window's final count (3) reaches the output while the process keeps running, and
    nothing else does; the output's timestamp is stream time moved past the window's
    end by the quiet."""
    source, sink = new_topic("idle-in"), new_topic("idle-out")
    window_start = (int(time.time() * 1000) // 2000) * 2000
    kafka.produce(source, [(b"k", b"v", window_start + offset) for offset in (1, 10, 20)],
                  partition=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_NAME=unique_name("idle"),
               KASPER_INPUT_TOPICS=source, KASPER_IDLE_ADVANCE="2", KASPER_BATCH_WAIT="0.2",
               KASPER_KEY_SERDE="str", KASPER_VALUE_SERDE="str",
               EXAMPLE_OUTPUT_TOPIC=sink)
    log = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kasper_py", "run", "idle_module:factory", "--stores",
         "idle_module:stores", "--app-dir", str(HERE)], env=env, stderr=log, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (found := kafka.read_all(sink)):
            assert process.poll() is None, (tmp_path / "stderr.log").read_text()
            assert time.monotonic() < deadline, "no final window within 60 s"
            time.sleep(0.5)
        assert process.poll() is None  # still running: no --until-caught-up
        [record] = found
        assert record.value() == f"'k':{window_start}:3".encode()
        assert record.timestamp()[1] >= window_start + 2000
    finally:
        process.terminate()
        process.wait(60)
        log.close()
