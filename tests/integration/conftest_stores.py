"""Fixtures and helpers of the store tests (loaded with ``pytest_plugins``): the stack's
Redis and Cassandra, a dedicated Redis server a test may stop, a TCP proxy that makes
Cassandra "go down", and the kill -9 harness around stores_worker.py."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from cassandra.cluster import Cluster

from kasper_py import Config, TopicProcessor
from kasper_py._support.ports import free_ports as free_port
from kasper_py.exceptions import StoreUnavailableError
from kasper_py.kafka.producer import OutputProducer
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.stack import cassandra_contact as stack_cassandra_contact
from kasper_py.stack import opensearch_url as stack_opensearch_url
from kasper_py.stack import redis_url as stack_redis_url
from kasper_py.stores.base import StoreRuntime, StoreSpec
from tests.container_stack import on_containers
from tests.kafka_clients import AdminClient
from tests.on_demand import on_demand

from stores_worker import WordCount  # isort: skip - a sibling script, not a package

WORKER = Path(__file__).with_name("stores_worker.py")
WORDS = [f"w{i % 37}" for i in range(3000)]
"""The word-count input most store tests use: 37 distinct words."""


def store_config(bootstrap: str, name: str, topic: str, **overrides: Any) -> Config:
    """The store tests' Config: batches of 200 messages or 0.2 s, str values."""
    values: dict[str, Any] = {"batch_size": 200, "batch_wait": 0.2, "value_serde": "str"}
    values.update(overrides)
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic], **values)


def run_until_caught_up(config: Config, store: StoreSpec, factory: Any = WordCount,
                        **kwargs: Any) -> None:
    """Run a TopicProcessor with the one store to the end of its input, then close it."""
    processor = TopicProcessor(config, factory, stores=[store], **kwargs)
    try:
        processor.run_loop(until_caught_up=True)
    finally:
        processor.close()


class TurnCounter(NoopObserver):
    """Counts the loop's turns, to bound round trips per turn."""

    def __init__(self) -> None:
        self.turns = 0

    def on_turn(self, stats: TurnStats) -> None:
        self.turns += 1



def wait_for(condition: Callable[[], object], what: str = "the condition",
             timeout: float = 60.0) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of the stack's Redis, started when it is not running (or ``$KASPER_REDIS_URL``);
    fails when it does not answer. With ``KASPER_STACK=containers`` a Redis in a
    container instead (tests/container_stack.py)."""
    if on_containers():
        return str(request.getfixturevalue("container_redis_url"))
    url = os.environ.get("KASPER_REDIS_URL") or stack_redis_url()
    on_demand("redis", url, redis.Redis.from_url(url, socket_connect_timeout=5).ping,
              external="KASPER_REDIS_URL" in os.environ)
    return url


@pytest.fixture(scope="session")
def cassandra_contact(request: pytest.FixtureRequest) -> tuple[str, int]:
    """(host, port) of the stack's Cassandra, started when it is not running; fails
    when CQL does not answer. With ``KASPER_STACK=containers`` a node in a container."""
    if on_containers():
        host, port = request.getfixturevalue("container_cassandra_contact")
        return str(host), int(port)
    host, port = stack_cassandra_contact()

    def answers() -> None:
        cluster = Cluster([host], port=port, connect_timeout=10)
        try:
            cluster.connect().execute("SELECT release_version FROM system.local")
        finally:
            cluster.shutdown()

    on_demand("cassandra", f"{host}:{port}", answers, external=False)
    return host, port


@pytest.fixture(scope="session")
def opensearch_url(request: pytest.FixtureRequest) -> str:
    """Base URL of the stack's OpenSearch, started when it is not running (or
    ``$KASPER_OPENSEARCH_URL``); fails when ``/_cluster/health`` does not answer. With
    ``KASPER_STACK=containers`` a node in a container."""
    if on_containers():
        return str(request.getfixturevalue("container_opensearch_url"))
    url = stack_opensearch_url()

    def answers() -> None:
        with urllib.request.urlopen(f"{url}/_cluster/health", timeout=5) as reply:
            assert reply.status == 200

    on_demand("opensearch", url, answers, external="KASPER_OPENSEARCH_URL" in os.environ)
    return url


class RedisServer:
    """A redis-server of the test's own (append-only file, fsync always), so a test
    can stop and restart it without touching the shared one."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self._process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (Redis syncs its AOF and exits) and wait."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(20)
        self._process = None


@pytest.fixture
def dedicated_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A started Redis on a free port, stopped after the test."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


class TcpProxy:
    """Forwards a local port to ``upstream``; ``stop()`` drops every connection and
    refuses new ones (the server looks down), ``start()`` serves again; ``hang()`` keeps
    taking connections and requests but forwards nothing more either way (the server
    looks paused, as under SIGSTOP), counting the requests held in ``held``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.hung = False
        self.held = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in ([listener] if listener else []) + sockets:
            _close(sock)

    def hang(self) -> None:
        """From now on nothing is forwarded and nothing answered; connections stay open."""
        self.hung = True

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = None if self.hung else socket.create_connection(self.upstream)
            except OSError:
                if self._listener is not listener:
                    return
                continue
            with self._lock:
                self._sockets += [client] if server is None else [client, server]
            if server is None:  # hung: the request is read and held, never answered
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target, source is client),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket | None,
              requests: bool = True) -> None:
        """Copy ``source`` to ``target`` until either closes; while hung, hold it (a
        client's ``requests`` are counted in ``held``)."""
        try:
            while data := source.recv(65536):
                if self.hung or target is None:
                    self.held += requests
                    continue
                target.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            if target is not None:
                _close(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def cassandra_proxy(cassandra_contact: tuple[str, int]) -> Iterator[TcpProxy]:
    """A started proxy in front of the stack's Cassandra."""
    proxy = TcpProxy(cassandra_contact)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def delete_changelogs(bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[None]:
    """Deletes the changelog and repartition topics that the test's processors created."""
    yield
    run = unique_name("")  # "-<run id>", the suffix of every name made in this test
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics
              if run in t and t.endswith(("-changelog", "-repartition"))]
    for future in (admin.delete_topics(topics).values() if topics else ()):
        with contextlib.suppress(Exception):  # cleanup is best-effort
            future.result(30)


def produce_words(kafka: Any, topic: str, words: Sequence[str], partitions: int) -> None:
    """One word per message, dealt round-robin over ``partitions``."""
    for partition in range(partitions):
        kafka.produce(topic, [w.encode() for w in words[partition::partitions]],
                      partition=partition)


def worker_args(kind: str, bootstrap: str, name: str, topic: str, batch_size: int,
                *options: str) -> list[str]:
    return [sys.executable, str(WORKER), kind, bootstrap, name, topic, str(batch_size),
            *options]


def kill_randomly_then_finish(args: list[str], kills: int, committed: Callable[[], int],
                              total: int, *, seed: int | None = None) -> list[int]:
    """Start the worker ``kills`` times, SIGKILL it at a random moment each time, then run
    it to the end of its input. ``committed()`` reads the group's committed total after
    each kill; returns those totals, and fails unless a kill landed mid-run (some of the
    ``total`` input committed, not all), so the test cannot pass without a real crash."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rng = random.Random(seed)
    at_kill: list[int] = []
    for _ in range(kills):
        before = committed()
        worker = subprocess.Popen(args, env=env, stdout=subprocess.PIPE)
        assert worker.stdout is not None and worker.stdout.readline() == b"started\n"
        time.sleep(rng.uniform(0.3, 1.5))
        # On a loaded machine a worker can need longer than the random pause to commit its
        # first batch; a kill before any progress proves nothing, so wait for some.
        deadline = time.monotonic() + 60
        while committed() == before < total and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.kill()
        worker.wait(30)
        at_kill.append(committed())
    assert any(0 < c < total for c in at_kill), f"no kill landed mid-run: {at_kill}"
    subprocess.run([*args, "--until-caught-up"], env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    return at_kill


def read_counts(spec: StoreSpec, config: Config, partitions: int,
                words: Sequence[str]) -> Counter[str]:
    """Every partition's counts of ``words`` summed, read through ``spec`` itself."""
    producer = OutputProducer(config)
    totals: Counter[str] = Counter()
    try:
        for partition in range(partitions):
            store = spec.open(StoreRuntime(config, partition, producer))
            totals.update(store.get_many(set(words)))
            store.close()
    finally:
        spec.close()
        producer.close()
    return totals


def check_discard_pending(spec: StoreSpec, config: Config) -> None:
    """A failed turn's buffered puts and deletes never reach the server once discarded:
    flush then writes nothing, and a fresh store reads only what was flushed before."""
    store = spec.open(StoreRuntime(config, 0))
    store.put("kept", 1)
    store.flush({})
    store.put_many({"new": 2, "kept": 3})
    store.delete("kept")
    store.discard_pending()
    store.flush({("t", 0): 5})
    assert store.round_trips == 1
    assert spec.open(StoreRuntime(config, 0)).get_many(["new", "kept"]) == {"kept": 1}


def assert_down_mid_turn_stops_uncommitted(
        kafka: Any, bootstrap: str, topic: str, name: str, *, spec: Callable[[], StoreSpec],
        stop: Callable[[], None], start: Callable[[], None], unreachable: str) -> None:
    """600 words in one partition, counted in batches of 100: the server is ``stop``ped
    between the reads and the flush of the turn from offset 200. The loop raises
    ``StoreUnavailableError`` saying ``unreachable``, the batch and its offsets, and
    commits nothing of that batch; once ``start``ed, a new run finishes with exact counts
    (``spec`` makes the store each run uses)."""
    words = [f"w{i % 11}" for i in range(600)]
    produce_words(kafka, topic, words, 1)
    failed_at: list[int] = []

    def stop_once(messages: list[Any]) -> None:
        if not failed_at and messages[0].offset >= 200:
            failed_at.append(messages[0].offset)
            stop()

    cfg = store_config(bootstrap, name, topic, batch_size=100)
    with pytest.raises(StoreUnavailableError) as info:
        run_until_caught_up(cfg, spec(), lambda c: WordCount(c, hook=stop_once))
    text = str(info.value)
    assert unreachable in text
    assert "batch not committed" in text and f"{topic}[0] offsets {failed_at[0]}.." in text
    assert kafka.committed(name, topic) == {0: failed_at[0]}
    start()
    run_until_caught_up(cfg, spec())
    assert kafka.committed(name, topic) == {0: 600}
    assert read_counts(spec(), cfg, 1, words) == Counter(words)


def produce_words_and_a_delete(kafka: Any, topic: str, words: Sequence[str]) -> None:
    """``words`` over the two partitions of ``topic``, then "gone" counted and deleted
    ("-gone") in partition 0: a table ends without the key."""
    produce_words(kafka, topic, words, 2)
    kafka.produce(topic, [b"gone", b"-gone"], partition=0)


class OpenedCounts:
    """A ``WordCount`` factory keeping each partition's counts store, whose round trips
    a test bounds."""

    def __init__(self) -> None:
        self.stores: list[Any] = []

    def __call__(self, context: Any) -> WordCount:
        processor = WordCount(context)
        self.stores.append(processor.counts)
        return processor

    @property
    def round_trips(self) -> int:
        """Requests the stores waited on, summed."""
        return sum(store.round_trips for store in self.stores)
