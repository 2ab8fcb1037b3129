"""Interactive queries as users run them: ``kasper run`` (and ``kasper run --processes
2``) serving a RocksDB table and a view on the query port, read over HTTP, with
``QueryClient`` and with ``kasper query``; a table fed by another kasper_py processor
found with the default settings; the state behind a bearer token."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kasper_py.exceptions import UnauthorizedError
from kasper_py.query import QueryClient
from tests.kafka_clients import Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import cli_env, kasper, kasper_command  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration
pytest_plugins = ["conftest_stores"]

HERE = Path(__file__).parent
KEYS = [f"user-{i}" for i in range(30)]
TOKEN = "query-token-of-the-cli-test"


def _records() -> list[tuple[bytes, bytes]]:
    """Key i appears 1 + i % 4 times."""
    return [(key.encode(), b"x") for i, key in enumerate(KEYS) for _ in range(1 + i % 4)]


def _expected() -> Counter[str]:
    return Counter(key.decode() for key, _ in _records())


def _config(tmp_path: Path, name: str, topic: str, **fields: Any) -> str:
    lines = [f'name = "{name}"', f'input_topics = ["{topic}"]', "batch_wait = 0.2",
             'key_serde = "str"', f'state_dir = "{tmp_path / "state"}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _held(client: QueryClient) -> dict[str, int]:
    """Every pair the instance asked holds (its partitions), or {} while not up."""
    try:
        return dict(client.scan("counts", page=7))
    except Exception:  # not serving yet, or a partition still opening
        return {}


@pytest.fixture
def running() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts ``kasper run`` processes; SIGTERMs whatever is left at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        process = subprocess.Popen([*kasper_command(), *args], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def _stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, wait; the exit must be 0; its stderr."""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    return err


def test_kasper_run_serves_tables_and_views(bootstrap: str, new_topic: Callable[..., str],  # noqa: PLR0917
                                           kafka: Any, unique_name: Callable[[str], str],
                                           tmp_path: Path, delete_changelogs: None,
                                           running: Any) -> None:
    """``kasper run --query-port`` serves the table: every value over HTTP, with the
    client and with ``kasper query`` equals the count; scans and the view answer; a
    partition the input lacks is a bad parameter (400), not one held elsewhere (421); the
    metrics port serves no state; the query port binds loopback only."""
    topic = new_topic("q-cli-in", partitions=3)
    kafka.produce(topic, _records())
    port, metrics = free_port(), free_port()
    config = _config(tmp_path, unique_name("q-cli"), topic, query_port=port,
                     metrics_port=metrics)
    env = cli_env(bootstrap)
    process = running("run", "queries_module:Count", "--stores", "queries_module:stores",
                      "--views", "queries_module:VIEWS", "--app-dir", str(HERE),
                      "--config", config, env=env)
    url = f"http://127.0.0.1:{port}"
    client = QueryClient(url)
    wait_for(lambda: _held(client) == _expected(), "every count served", timeout=90)
    assert {key: client.get("counts", key) for key in KEYS} == _expected()
    status, body = _get(f"{url}/tables/counts/user-5")
    assert (status, body["value"]) == (200, 2)
    assert dict(client.scan("counts", prefix="user-1")) == {
        k: n for k, n in _expected().items() if k.startswith("user-1")}
    for partition in (3, 99999, -3):
        for path in (f"counts?partition={partition}", f"counts/user-5?partition={partition}"):
            status, body = _get(f"{url}/tables/{path}")
            assert (status, body["error"]) == (400, "BadQueryError"), body
            assert f"partition={partition} is out of range" in body["message"]
            assert body["message"].endswith(" are 0..2")
    status, body = _get(f"{url}/top?n=3")
    assert status == 200 and body["top"] == [["user-11", 4], ["user-15", 4], ["user-19", 4]]
    status, body = _get(f"http://127.0.0.1:{metrics}/tables")
    assert status == 404 and body["status"] == 404  # state is not on the metrics port
    answer = kasper("query", "--url", url, "counts", "user-7", env=env)
    assert (answer.returncode, answer.stdout) == (0, "4\n"), answer.stderr
    answer = kasper("query", "--url", url, "counts", "--prefix", "user-2", env=env)
    assert answer.returncode == 0, answer.stderr
    assert dict(map(json.loads, answer.stdout.splitlines())) == {
        k: n for k, n in _expected().items() if k.startswith("user-2")}
    with pytest.raises(OSError):  # loopback only: not on the host's other addresses
        _reach_beyond_loopback(port)
    _stop(process)


def _reach_beyond_loopback(port: int) -> None:
    """Connect to ``port`` on an address of this host that is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: picks the outbound address
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this host has no address beyond loopback")
    socket.create_connection((address, port), timeout=5).close()


def test_a_chain_of_processors_is_queried_with_default_settings(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        tmp_path: Path, delete_changelogs: None, running: Any) -> None:
    """A relay (kasper run) writes a keyed topic with kasper_py's producer; a counting
    processor reads it with ``--processes 2`` and the default query_partitioner: every
    key is found through worker 0 (redirected to worker 1 for its partitions) and with
    ``kasper query``, behind a bearer token."""
    source, middle = new_topic("q-chain-in", partitions=4), new_topic("q-chain-mid",
                                                                      partitions=4)
    producer = Producer({"bootstrap.servers": bootstrap})  # librdkafka's default partitioner
    for key, value in _records():
        producer.produce(source, value, key)
    assert producer.flush(30) == 0
    env = cli_env(bootstrap, QUERIES_RELAY_TOPIC=middle)
    relay = kasper("run", "queries_module:Relay", "--app-dir", str(HERE), "--config",
                   _config(tmp_path, unique_name("q-relay"), source), "--until-caught-up",
                   env=env)
    assert relay.returncode == 0, relay.stderr[-3000:]
    port = free_port(2)  # worker i serves queries on P+i
    config = _config(tmp_path, unique_name("q-chain"), middle, query_port=port)
    env = cli_env(bootstrap, KASPER_QUERY_TOKEN=TOKEN)
    running("run", "queries_module:Count", "--stores", "queries_module:stores",
            "--app-dir", str(HERE), "--config", config, "--processes", "2", env=env)
    workers = [QueryClient(f"http://127.0.0.1:{port + i}", token=TOKEN) for i in (0, 1)]
    wait_for(lambda: Counter(_held(workers[0])) + Counter(_held(workers[1])) == _expected(),
             "both workers serving every count", timeout=120)
    elsewhere = [k for k in KEYS if k in _held(workers[1])]
    assert elsewhere and all(k not in _held(workers[0]) for k in elsewhere)
    wait_for(lambda: _all_found(workers[0]), "every key through worker 0", timeout=30)
    assert {key: workers[0].get("counts", key) for key in KEYS} == _expected()
    answer = kasper("query", "--url", f"http://127.0.0.1:{port}", "counts", elsewhere[0],
                    env=env)
    assert (answer.returncode, answer.stdout) == (0, f"{_expected()[elsewhere[0]]}\n"), \
        answer.stderr
    with pytest.raises(UnauthorizedError):
        QueryClient(f"http://127.0.0.1:{port}").get("counts", KEYS[0], key_serde="str")
    refused = kasper("query", "--url", f"http://127.0.0.1:{port}", "counts", KEYS[0],
                     env=cli_env(bootstrap))
    assert refused.returncode == 5 and "Bearer" in refused.stderr


def _all_found(client: QueryClient) -> bool:
    """Every key answers (a redirect needs worker 1's first commit note)."""
    try:
        return all(client.get("counts", key) for key in KEYS)
    except Exception:
        return False
