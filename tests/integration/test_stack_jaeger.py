"""`kasper stack up|status|down jaeger`: Jaeger v2, built once with ``go`` from the Go
module proxy, answers its query API and takes OTLP over HTTP; a missing ``go`` and a bad
port variable are refused with the cause. Uses the stack of $KASPER_STACK_DIR (default
./.kasper-stack): a running Jaeger is reused and left running; one started here is
stopped again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from kasper_py import stack

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def kasper_stack(*args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kasper_py", "stack", *args],
                          capture_output=True, text=True, env=env or dict(os.environ),
                          timeout=1200, check=False)


def jaeger_line() -> str:
    """The jaeger line of `kasper stack status`."""
    status = kasper_stack("status")
    assert status.returncode == 0, status.stderr
    (line,) = [line for line in status.stdout.splitlines() if line.startswith("jaeger ")]
    return line


def one_span(service: str) -> dict[str, Any]:
    """An OTLP/JSON export request of one span of ``service``."""
    now = time.time_ns()
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": service}}]},
        "scopeSpans": [{"spans": [{
            "traceId": uuid.uuid4().hex, "spanId": uuid.uuid4().hex[:16], "name": "probe",
            "kind": 1, "startTimeUnixNano": str(now - 1_000_000),
            "endTimeUnixNano": str(now)}]}]}]}


def services() -> list[str]:
    """The services Jaeger's query API lists (``data`` is null while there are none)."""
    with urllib.request.urlopen(f"{stack.jaeger_url()}/api/services", timeout=5) as reply:
        return json.loads(reply.read())["data"] or []


def test_up_jaeger_serves_queries_and_takes_otlp() -> None:
    """`up jaeger` (the first time: a Go build) starts it; status shows it running at its
    query port; a span exported over OTLP/HTTP makes its service appear in the query
    API; `down jaeger` stops what this test started."""
    started_here = "stopped" in jaeger_line()
    up = kasper_stack("up", "jaeger")
    assert up.returncode == 0, up.stderr
    address = stack.jaeger_url().removeprefix("http://")
    assert f"jaeger: started at {address}" in up.stdout or \
        "jaeger: already running" in up.stdout, up.stdout
    try:
        assert jaeger_line().split()[1:2] == ["running"]
        assert jaeger_line().split()[-1] == address
        service = f"stack-test-{uuid.uuid4().hex[:8]}"
        export = urllib.request.Request(
            f"{stack.jaeger_otlp_endpoint()}/v1/traces", data=json.dumps(one_span(service))
            .encode(), headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(export, timeout=5) as reply:
            assert reply.status == 200
        wait_for(lambda: service in services(), f"{service} listed by /api/services")
    finally:
        if started_here:
            down = kasper_stack("down", "jaeger")
            assert down.returncode == 0 and "jaeger: stopped (pid " in down.stdout, down
    if started_here:
        assert jaeger_line().split()[1] == "stopped"


def test_up_jaeger_without_go_names_what_to_install(tmp_path: Path) -> None:
    """A stack with no Jaeger built yet and no ``go`` on PATH: exit 1, naming Go."""
    env = {**os.environ, "KASPER_STACK_DIR": str(tmp_path), "PATH": str(tmp_path / "bin"),
           "KASPER_STACK_CACHE": str(tmp_path / "cache")}  # no Jaeger built for this user
    up = kasper_stack("up", "jaeger", env=env)
    assert (up.returncode, up.stderr.strip()) == (
        1, "error: go not found on PATH: install Go 1.24.6 or later (https://go.dev/dl/)")
    assert not (tmp_path / "jaeger" / "jaeger.pid").exists()


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("KASPER_JAEGER_PORT", "abc", "error: KASPER_JAEGER_PORT='abc' is not a port number"),
    ("KASPER_JAEGER_OTLP_HTTP_PORT", "70000",
     "error: KASPER_JAEGER_OTLP_HTTP_PORT=70000 is outside 1-65535"),
])
def test_bad_jaeger_port_is_refused(tmp_path: Path, variable: str, value: str,
                                    message: str) -> None:
    env = {**os.environ, "KASPER_STACK_DIR": str(tmp_path), variable: value}
    up = kasper_stack("up", "jaeger", env=env)
    assert (up.returncode, up.stderr.strip()) == (1, message)
