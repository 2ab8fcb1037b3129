"""Interactive queries against the real broker and stores: values over HTTP equal the
table after a run (RocksDB, Redis, a windowed table), a key on another instance is
redirected, and readers hammering the tables during a run never fail it."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.cli import main
from kasper_py.exceptions import (
    BadQueryError,
    KeyNotFoundError,
    NotFoundError,
    NotHereError,
    QueryUnavailableError,
)
from kasper_py.query import QueryClient, partition_for
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.windows import Tumbling, WindowedTable, count
from tests.kafka_clients import Producer

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytest_plugins = ["conftest_stores"]
KEYS = [f"user-{i}" for i in range(40)]


class KeyCount(MessageProcessor):
    """Counts messages per key in "counts" and sends each message on to ``output``."""

    def __init__(self, context: ProcessorContext, output: str | None = None) -> None:
        self.counts = context.store("counts")
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
            if self.output:
                sender.send(self.output, m.value, m.key)
        self.counts.put_many(totals)


def _config(bootstrap: str, name: str, topic: str, **overrides: Any) -> Config:
    port = free_port()
    values: dict[str, Any] = {
        "batch_size": 200, "batch_wait": 0.2, "key_serde": "str", "query_port": port}
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[topic],
                  **{**values, **overrides})


def _produce_keys(kafka: Any, topic: str, repeat: int) -> Counter[str]:
    """Each key ``repeat`` times more than its index mod 3, placed by murmur2 (the
    helper's producer uses ``partitioner=murmur2_random``)."""
    records = [(key.encode(), b"v") for i, key in enumerate(KEYS)
               for _ in range(repeat + i % 3)]
    kafka.produce(topic, records)
    return Counter(key.decode() for key, _ in records)


def _status(url: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, JSON body and headers of a GET that does not follow redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest.mark.parametrize("partitioner", ["crc32", "murmur2"])
def test_partitioner_matches_confluent_kafka(bootstrap, new_topic, partitioner) -> None:
    """Keys produced with librdkafka's default partitioner (consistent_random) land where
    crc32 says, and with partitioner=murmur2_random where the Java murmur2 says."""
    topic = new_topic("parts", partitions=7)
    conf = {"bootstrap.servers": bootstrap}
    if partitioner == "murmur2":
        conf["partitioner"] = "murmur2_random"
    producer, landed = Producer(conf), []
    for i in range(300):
        producer.produce(topic, b"v", f"key-{i}".encode(),
                         on_delivery=lambda err, m: landed.append((err, m.key(), m.partition())))
    assert producer.flush(30) == 0
    assert len(landed) == 300 and all(err is None for err, _, _ in landed)
    assert {p for _, _, p in landed} == set(range(7))
    assert all(partition_for(key, 7, partitioner) == p for _, key, p in landed)


def test_rocksdb_values_over_http_equal_the_table(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917
                                                  tmp_path, delete_changelogs, capsys) -> None:
    """After a run, every key read over HTTP (client, raw GET, query(), ``kasper
    query``) equals the count; scans page through exactly the table, in key order per
    partition."""
    topic = new_topic("in", partitions=3)
    expected = _produce_keys(kafka, topic, repeat=5)
    config = _config(bootstrap, unique_name("q-rocks"), topic, state_dir=str(tmp_path))
    processor = TopicProcessor(config, KeyCount, stores=[RocksDBTable("counts")])
    try:
        processor.run_loop(until_caught_up=True)
        client = QueryClient(processor.endpoint or "")
        assert {key: client.get("counts", key) for key in KEYS} == expected
        assert {key: processor.query("counts", key) for key in KEYS} == expected
        scanned = list(client.scan("counts", page=7))
        assert dict(scanned) == expected and len(scanned) == len(expected)
        ones = [key for key, _ in client.scan("counts", prefix="user-1")]
        assert sorted(ones) == sorted(k for k in KEYS if k.startswith("user-1"))
        page = processor.scan("counts", limit=1000)
        for partition in range(3):  # key order within each partition, one after another
            keys = [k for k, _, p in page["items"] if p == partition]
            assert keys and keys == sorted(keys)
        ranged = dict(client.scan("counts", start="user-2", end="user-3"))
        assert ranged == {k: n for k, n in expected.items() if "user-2" <= k < "user-3"}
        with pytest.raises(KeyNotFoundError, match="no value for key 'nobody'"):
            client.get("counts", "nobody")
        status, body, _ = _status(f"{processor.endpoint}/tables/nope/x")
        assert status == 404 and "its tables: ['counts']" in body["message"]
        _check_cli(processor.endpoint or "", expected, capsys)
    finally:
        processor.close()


def _check_cli(url: str, expected: Counter[str], capsys: Any) -> None:
    """``kasper query``: a value, a limited prefix scan as [key, value] lines, the exit
    codes of a missing key (1) and table (1), and the message naming them."""
    capsys.readouterr()
    assert main(["query", "--url", url, "counts", "user-7"]) == 0
    assert capsys.readouterr().out == f"{expected['user-7']}\n"
    assert main(["query", "--url", url, "counts", "--prefix", "user-1", "--limit", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3 and all(expected[k] == n and k.startswith("user-1") for k, n in lines)
    assert main(["query", "--url", url, "counts", "nobody"]) == 1
    assert "no value for key 'nobody'" in capsys.readouterr().err
    assert main(["query", "--url", url, "nope", "x"]) == 1
    assert "nope" in capsys.readouterr().err


def test_redis_values_and_prefix_scan(bootstrap, new_topic, kafka, unique_name,
                                      redis_url) -> None:
    """Redis: values over HTTP equal the counts; a prefix scan (SCAN MATCH, unordered)
    returns each matching key; a range scan is refused with 400 saying why."""
    topic = new_topic("in", partitions=2)
    expected = _produce_keys(kafka, topic, repeat=3)
    config = _config(bootstrap, unique_name("q-redis"), topic)
    processor = TopicProcessor(config, KeyCount, stores=[RedisTable("counts", url=redis_url)])
    try:
        processor.run_loop(until_caught_up=True)
        client = QueryClient(processor.endpoint or "")
        assert {key: client.get("counts", key) for key in KEYS} == expected
        assert dict(client.scan("counts", prefix="user-3", page=3)) == {
            k: n for k, n in expected.items() if k.startswith("user-3")}
        with pytest.raises(BadQueryError, match="Redis keeps no key order"):
            list(client.scan("counts", start="a"))
    finally:
        processor.close()


class Views(MessageProcessor):
    """Counts views per user and minute in a windowed table kept in "windows"."""

    def __init__(self, context: ProcessorContext) -> None:
        # str keys: the table's key bytes are the input's, so queries find the partition
        self.views = WindowedTable(context, "windows", Tumbling(60, grace=3600), count(),
                                   key_serde="str")

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.views.update((m.key, m.timestamp, m.value) for m in messages)


def test_windowed_table_query(bootstrap, new_topic, kafka, unique_name, tmp_path,  # noqa: PLR0917
                              delete_changelogs) -> None:
    """A windowed table's windows of a key over HTTP equal the counts per minute, and
    from/to select the windows overlapping them."""
    topic = new_topic("views", partitions=2)
    hour_ago = (int(time.time()) - 3600) * 1000  # within the broker's 24 h retention
    start = hour_ago - hour_ago % 60_000
    records = [(f"u{i % 3}".encode(), b"1", start + i * 7_000) for i in range(60)]
    kafka.produce(topic, records)
    config = _config(bootstrap, unique_name("q-win"), topic, state_dir=str(tmp_path))
    table = RocksDBTable("windows", key_serde="bytes", value_serde="bytes")
    processor = TopicProcessor(config, Views, stores=[table])
    try:
        processor.run_loop(until_caught_up=True)
        client = QueryClient(processor.endpoint or "")
        expected = Counter((key.decode(), ts - ts % 60_000) for key, _, ts in records)
        got = {(user, w["start"]): w["value"] for user in ("u0", "u1", "u2")
               for w in client.windows("windows", user)}
        assert got == expected
        second = client.windows("windows", "u1", start + 60_000, start + 119_999)
        assert [w["start"] for w in second] == [start + 60_000]
        status, body, _ = _status(f"{processor.endpoint}/tables/windows/u1?from=soon")
        assert (status, body["message"]) == (400, "parameter from='soon' is not an integer")
        status, body, _ = _status(f"{processor.endpoint}/tables/windows")
        assert status == 400 and "is windowed: read a key's windows" in body["message"]
    finally:
        processor.close()


def test_key_on_another_instance_is_redirected(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917
                                               tmp_path, delete_changelogs) -> None:
    """Two loops on disjoint static partitions: asking one for a key the other holds
    answers 307 to the other (which the client follows); a partition nobody runs
    answers 421 naming it."""
    topic = new_topic("in", partitions=3)
    expected = _produce_keys(kafka, topic, repeat=2)
    name = unique_name("q-two")
    first = TopicProcessor(_config(bootstrap, name, topic, input_partitions=[0],
                                   state_dir=str(tmp_path / "a")),
                           KeyCount, stores=[RocksDBTable("counts")])
    second = TopicProcessor(_config(bootstrap, name, topic, input_partitions=[1],
                                    state_dir=str(tmp_path / "b")),
                            KeyCount, stores=[RocksDBTable("counts")])
    try:
        first.run_loop(until_caught_up=True)
        second.run_loop(until_caught_up=True)
        by_partition = {p: [k for k in KEYS if partition_for(k.encode(), 3, "murmur2") == p]
                        for p in range(3)}
        key = by_partition[1][0]
        status, body, headers = _status(f"{first.endpoint}/tables/counts/{key}")
        assert status == 307 and body["partition"] == 1
        assert headers["Location"] == f"{second.endpoint}/tables/counts/{key}"
        client = QueryClient(first.endpoint or "")
        assert {k: client.get("counts", k) for k in by_partition[0] + by_partition[1]} == {
            k: expected[k] for k in by_partition[0] + by_partition[1]}
        nobody = by_partition[2][0]
        status, body, _ = _status(f"{first.endpoint}/tables/counts/{nobody}")
        assert (status, body["partition"], body["endpoint"]) == (421, 2, None)
        assert "no running instance announced an endpoint" in body["message"]
        with pytest.raises(NotHereError) as caught:
            client.get("counts", nobody)
        assert caught.value.partition == 2
        with pytest.raises(NotHereError) as not_here:
            first.query("counts", key)
        assert not_here.value.endpoint == second.endpoint
    finally:
        first.close()
        second.close()


def test_concurrent_reads_never_fail_the_run(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917
                                             tmp_path, delete_changelogs) -> None:
    """Reader threads hammer get and scan (HTTP and in-process) while the loop runs: the
    run completes with exact output, offsets and table; every read succeeded or found
    no key yet (or, before the loop opened its partitions, was told so), and no count a
    reader saw ever went down (whole committed turns only). Each reader keeps its own
    record: two threads' reads are not ordered against each other, only one thread's."""
    topic, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    expected = _produce_keys(kafka, topic, repeat=150)
    total = sum(expected.values())
    config = _config(bootstrap, unique_name("q-hammer"), topic, state_dir=str(tmp_path),
                     batch_size=100)
    processor = TopicProcessor(config, lambda c: KeyCount(c, output),
                               stores=[RocksDBTable("counts")])
    client = QueryClient(processor.endpoint or "")
    stop, errors, reads = threading.Event(), [], Counter()
    seen_by: list[dict[str, int]] = [{} for _ in range(4)]

    def reader(index: int) -> None:
        seen = seen_by[index]
        while not stop.is_set():
            key = KEYS[(reads[index] * 7 + index) % len(KEYS)]
            try:
                value = client.get("counts", key) if index % 2 else processor.query(
                    "counts", key)
                if value < seen.get(key, 0):
                    errors.append(f"{key} went from {seen[key]} down to {value}")
                seen[key] = max(value, seen.get(key, 0))
                if reads[index] % 10 == 0:
                    list(client.scan("counts", page=50))
            except NotFoundError:
                pass  # not counted yet
            except (QueryUnavailableError, NotHereError) as exc:
                if any(seen_by):  # only while the loop starts: partitions not open yet
                    errors.append(repr(exc))
            except Exception as exc:  # any other failure fails the test
                errors.append(repr(exc))
            reads[index] += 1

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        processor.run_loop(until_caught_up=True)
        committed = processor.committed_offsets()
        final = {key: processor.query("counts", key) for key in KEYS}
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        processor.close()
    assert not errors, errors[:5]
    assert min(reads.values()) > 10
    assert final == expected
    assert sum(committed.values()) == total  # type: ignore[arg-type]
    assert Counter(m.key().decode() for m in kafka.read_all(output)) == expected
