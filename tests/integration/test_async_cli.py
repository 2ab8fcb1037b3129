"""`kasper run` of an ``AsyncMessageProcessor`` (async_module.py) against the stack's
Kafka and a lookup service run by the test (a threaded HTTP server with injected
latency, errors and hangs): a process killed with -9 mid-batch, a lookup that fails, a
batch past ``async_timeout``, and a failing lookup dead-lettered. The committed offset
is checked after each."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite
from test_cli import cli_env, kasper, kasper_command, write_config  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


class LookupService(ThreadingHTTPServer):
    """``/lookup/<n>`` answers ``looked-up-<n>`` after ``latency`` seconds; ``n`` in
    ``failing`` answers 500, in ``hanging`` never answers (until the server closes)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.latency = 0.05
        self.failing: set[str] = set()
        self.hanging: set[str] = set()
        self.served = 0
        self.in_flight = 0
        self.closed = threading.Event()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: LookupService

    def do_GET(self) -> None:
        service, value = self.server, self.path.rsplit("/", 1)[-1]
        with service.lock:
            service.in_flight += 1
        try:
            wait = 3600.0 if value in service.hanging else service.latency
            if service.closed.wait(wait):
                return
            status = 500 if value in service.failing else 200
            body = f"looked-up-{value}".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        finally:
            with service.lock:
                service.in_flight -= 1
                service.served += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def lookup_service() -> Iterator[LookupService]:
    service = LookupService()
    thread = threading.Thread(target=service.serve_forever, daemon=True)
    thread.start()
    yield service
    service.closed.set()
    service.shutdown()
    service.server_close()


@dataclass
class Stack:
    """What each test uses: the broker's helpers, a temporary folder, the service."""

    bootstrap: str
    new_topic: Callable[..., str]
    kafka: Any
    unique_name: Callable[[str], str]
    tmp_path: Path
    service: LookupService


@pytest.fixture
def stack(bootstrap: str, new_topic: Callable[..., str], kafka: Any,  # noqa: PLR0917 - fixtures
          unique_name: Callable[[str], str], tmp_path: Path,
          lookup_service: LookupService) -> Stack:
    return Stack(bootstrap, new_topic, kafka, unique_name, tmp_path, lookup_service)


def run_args(config: str, *extra: str) -> list[str]:
    return ["run", "async_module:Lookup", "--app-dir", str(HERE), "--config", config, *extra]


def outputs(kafka: Any, topic: str) -> list[str]:
    return [m.value().decode() for m in kafka.read_all(topic)]


def setup(stack: Stack, count: int) -> tuple[str, str]:
    """Fresh input and output topics; ``count`` values 0, 1, ... under keys k0..k4."""
    source, sink = stack.new_topic("async-in"), stack.new_topic("async-out")
    stack.kafka.produce(source, [(f"k{n % 5}".encode(), str(n).encode()) for n in range(count)])
    return source, sink


def test_kill_9_mid_batch_then_restart(stack: Stack) -> None:
    """A run killed with -9 while a batch's lookups are in flight: every output of a
    committed offset was produced before it; the restarted run looks up the rest and
    commits to the end; only uncommitted messages appear twice."""
    count = 60
    source, sink = setup(stack, count)
    stack.service.latency = 0.3
    name = stack.unique_name("async-kill")
    config = write_config(stack.tmp_path, name, source, batch_size=10, max_latency="none",
                          async_concurrency=5)
    env = cli_env(stack.bootstrap, LOOKUP_URL=stack.service.url, LOOKUP_OUTPUT_TOPIC=sink)
    process = subprocess.Popen([*kasper_command(), *run_args(config)],
                               stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: (stack.kafka.committed(name, source)[0] or 0) >= 10, "a first commit")
        wait_for(lambda: stack.service.in_flight > 0, "lookups in flight")
        process.kill()
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    committed = stack.kafka.committed(name, source)[0] or 0
    assert 10 <= committed < count
    before = set(outputs(stack.kafka, sink))
    assert {f"looked-up-{n}" for n in range(committed)} <= before

    stack.service.latency = 0.01
    result = kasper(*run_args(config, "--until-caught-up"), env=env)
    assert result.returncode == 0, result.stderr
    after = outputs(stack.kafka, sink)
    assert set(after) == {f"looked-up-{n}" for n in range(count)}
    twice = {value for value in after if after.count(value) > 1}
    assert all(int(value.rsplit("-", 1)[1]) >= committed for value in twice)
    assert stack.kafka.committed(name, source)[0] == count


def test_failed_lookup_exits_1_uncommitted(stack: Stack) -> None:
    """A lookup answered 500 fails the run with exit 1 naming the partition and the
    error; the batch holding it is not committed."""
    source, sink = setup(stack, 20)
    stack.service.failing = {"7"}
    name = stack.unique_name("async-fail")
    config = write_config(stack.tmp_path, name, source, batch_size=5, max_latency="none")
    env = cli_env(stack.bootstrap, LOOKUP_URL=stack.service.url, LOOKUP_OUTPUT_TOPIC=sink)
    result = kasper(*run_args(config, "--until-caught-up"), env=env)
    assert result.returncode == 1
    [error] = [line for line in result.stderr.splitlines() if line.startswith("kasper:")]
    assert "partition 0" in error and "LookupFailedError: lookup of 7 answered 500" in error
    committed = stack.kafka.committed(name, source)[0] or 0
    assert committed <= 7
    assert {f"looked-up-{n}" for n in range(committed)} <= set(outputs(stack.kafka, sink))


def test_batch_past_async_timeout_exits_1_uncommitted(stack: Stack) -> None:
    """A lookup that never answers holds its batch past ``--async-timeout``: the run
    exits 1 with a TimeoutError naming the setting; that batch is not committed."""
    source, sink = setup(stack, 10)
    stack.service.hanging = {"3"}
    name = stack.unique_name("async-timeout")
    config = write_config(stack.tmp_path, name, source, batch_size=5, max_latency="none")
    env = cli_env(stack.bootstrap, LOOKUP_URL=stack.service.url, LOOKUP_OUTPUT_TOPIC=sink)
    result = kasper(*run_args(config, "--until-caught-up", "--async-timeout", "1"), env=env)
    assert result.returncode == 1
    [error] = [line for line in result.stderr.splitlines() if line.startswith("kasper:")]
    assert "TimeoutError" in error and "async_timeout=1.0s" in error
    assert (stack.kafka.committed(name, source)[0] or 0) <= 3


def test_failed_lookup_dead_lettered(stack: Stack) -> None:
    """``on_process_error = "dead_letter"``: the failing message goes to the dead letter
    topic with its bytes, every other message is looked up once, all committed."""
    source, sink = setup(stack, 20)
    dlq = stack.new_topic("async-dlq")
    stack.service.failing = {"7"}
    name = stack.unique_name("async-dlq")
    config = write_config(stack.tmp_path, name, source, batch_size=5, max_latency="none",
                          on_process_error="dead_letter", dead_letter_topic=dlq)
    env = cli_env(stack.bootstrap, LOOKUP_URL=stack.service.url, LOOKUP_OUTPUT_TOPIC=sink)
    result = kasper(*run_args(config, "--until-caught-up"), env=env)
    assert result.returncode == 0, result.stderr
    expected = sorted(f"looked-up-{n}" for n in range(20) if n != 7)
    assert sorted(outputs(stack.kafka, sink)) == expected
    assert [(m.key(), m.value()) for m in stack.kafka.read_all(dlq)] == [(b"k2", b"7")]
    assert stack.kafka.committed(name, source)[0] == 20
