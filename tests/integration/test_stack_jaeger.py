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
import urllib.request
from pathlib import Path

import pytest

from kasper_py import stack

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


def test_up_jaeger_serves_queries_and_takes_otlp() -> None:
    """`up jaeger` (the first time: a Go build) starts it; status shows it running at its
    query port; the query API lists services; an OTLP/HTTP export is accepted; `down
    jaeger` stops what this test started."""
    started_here = "stopped" in jaeger_line()
    up = kasper_stack("up", "jaeger")
    assert up.returncode == 0, up.stderr
    address = stack.jaeger_url().removeprefix("http://")
    assert f"jaeger: started at {address}" in up.stdout or \
        "jaeger: already running" in up.stdout, up.stdout
    try:
        assert jaeger_line().split()[1:2] == ["running"]
        assert jaeger_line().split()[-1] == address
        with urllib.request.urlopen(f"{stack.jaeger_url()}/api/services", timeout=5) as reply:
            assert isinstance(json.loads(reply.read())["data"], list)
        export = urllib.request.Request(
            f"{stack.jaeger_otlp_endpoint()}/v1/traces", data=b'{"resourceSpans": []}',
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(export, timeout=5) as reply:
            assert reply.status == 200
    finally:
        if started_here:
            down = kasper_stack("down", "jaeger")
            assert down.returncode == 0 and "jaeger: stopped (pid " in down.stdout, down
    if started_here:
        assert jaeger_line().split()[1] == "stopped"


def test_up_jaeger_without_go_names_what_to_install(tmp_path: Path) -> None:
    """A stack with no Jaeger built yet and no ``go`` on PATH: exit 1, naming Go."""
    env = {**os.environ, "KASPER_STACK_DIR": str(tmp_path), "PATH": str(tmp_path / "bin")}
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
