"""During a broker outage the clients' own lines (librdkafka's ``%3|...|FAIL|...``)
come out as the library's JSON events, not as raw text on stderr. The broker here is
a closed port on 127.0.0.1, so no stack is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kasper_py._support.ports import free_ports as closed_port

pytestmark = pytest.mark.integration

WORKER = Path(__file__).parent / "outage_worker.py"



def test_client_lines_reach_the_json_log_not_raw_stderr() -> None:
    """The consumer's and the producer's refused connections are ``kasper.client_log``
    warnings naming the client and the broker; no raw librdkafka line reaches stderr."""
    port = closed_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(WORKER), f"127.0.0.1:{port}", "3"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    raw = [line for line in done.stderr.splitlines() if line.startswith("%")]
    assert not raw, raw[:3]
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    failures = [e for e in events if e["event"] == "kasper.client_log"
                and e["facility"] == "FAIL" and f"127.0.0.1:{port}" in e["message"]]
    assert {e["client"] for e in failures} == {"consumer", "producer"}, events
    assert all(_is_refused_warning(e) for e in failures), failures


def _is_refused_warning(event: dict[str, Any]) -> bool:
    return (event["level"] == "warning" and event["rdkafka_level"] == "error"
            and event["processor"] == "outage" and "Connection refused" in event["message"])
