"""Queries without a broker: the partitioners' known vectors, the commit note's
endpoint, the Config fields, scan bounds, and HTTP reads and views of a loop running
on the in-memory broker with a MemoryTable."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.exceptions import (
    BadQueryError,
    ConfigError,
    KeyNotFoundError,
    NotHereError,
    UnknownTableError,
)
from kasper_py.kafka.offsets import CommitNote
from kasper_py.query import QueryClient, Request, Response, Scan, Tables, murmur2, partition_for
from kasper_py.stores.base import prefix_end
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker

# Kafka's own UtilsTest.testMurmur2 vectors (Java's signed ints), and librdkafka's.
JAVA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482,
                b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
                b"abc": 479470107, b"kafka": -798503068}


def test_murmur2_matches_the_java_client() -> None:
    """The Java client's murmur2 values, signed as Java returns them."""
    assert {key: murmur2(key) for key in JAVA_MURMUR2} == JAVA_MURMUR2


def test_partition_for_both_partitioners() -> None:
    """crc32 is zlib's CRC-32 mod n (librdkafka's consistent_random); murmur2 masks the
    sign bit first, like the Java client's toPositive."""
    assert partition_for(b"21", 7, "murmur2") == (-973932308 & 0x7FFFFFFF) % 7
    assert partition_for(b"kafka", 100, "murmur2") == (-798503068 & 0x7FFFFFFF) % 100
    assert partition_for(b"123456789", 1000, "crc32") == 0xCBF43926 % 1000  # CRC-32 check
    assert partition_for(b"", 7, "murmur2") == 2  # hashed, as librdkafka's murmur2_random
    with pytest.raises(ValueError, match="empty key has no partition with the crc32"):
        partition_for(b"", 7, "crc32")
    with pytest.raises(ValueError, match="unknown partitioner 'fnv'"):
        partition_for(b"a", 7, "fnv")  # type: ignore[arg-type]


def test_commit_note_carries_the_endpoint() -> None:
    """The endpoint survives encode/decode, with and without a partition set; notes
    written before endpoints existed still decode."""
    note = CommitNote("running", 12.5, "host", 7, "0-3", "http://10.0.0.1:9100")
    assert note.encode() == "kasper/1 running 12.500 host 7 0-3 endpoint=http://10.0.0.1:9100"
    assert CommitNote.decode(note.encode()) == note
    bare = CommitNote("stopped", 1.0, "h", 2, None, "http://h:1")
    assert CommitNote.decode(bare.encode()) == bare
    assert CommitNote.decode("kasper/1 running 1.000 h 2 all") == CommitNote(
        "running", 1.0, "h", 2, "all", None)


def test_config_query_fields_are_checked() -> None:
    """A bad partitioner or endpoint fails at construction, naming the field."""
    base: dict[str, Any] = {"name": "q", "bootstrap_servers": "b:1", "input_topics": ["t"]}
    with pytest.raises(ConfigError, match=r"query_partitioner.*'murmur2'.*got 'java'"):
        Config(**base, query_partitioner="java")
    with pytest.raises(ConfigError, match=r"query_endpoint.*got 'host:9100'"):
        Config(**base, query_endpoint="host:9100")
    assert Config(**base, query_endpoint="http://h:9/").query_endpoint == "http://h:9"


def test_scan_bounds() -> None:
    """A prefix becomes a key range; a range scan is refused where a backend says so."""
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None
    assert Scan(prefix=b"ab", start=b"aa", end=b"zz").bounds() == (b"ab", b"ac")
    assert Scan(start=b"c", end=b"f").bounds() == (b"c", b"f")
    with pytest.raises(BadQueryError, match="Redis tables cannot be scanned by key range"):
        Scan(start=b"a").refuse_range("Redis", "no order")


class KeyCount(MessageProcessor):
    """Counts messages per key in the table "counts"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
        self.counts.put_many(totals)


def top(request: Request, tables: Tables) -> Response:
    """A view: the ``n`` biggest counts of this instance."""
    page = tables.scan("counts", Scan(limit=1000))
    ranked = sorted(page["items"], key=lambda item: -item[1])[:int(request.params["n"])]
    return Response({"top": [[key, count] for key, count, _ in ranked]})


def failing(request: Request, tables: Tables) -> Any:
    """A view with a bug."""
    raise RuntimeError("boom")


@pytest.fixture
def served() -> Any:
    """A loop over the in-memory broker, caught up on 2 partitions, serving queries."""
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    for i in range(60):
        key = f"k{i % 6}"
        broker.produce("in", b"v", key=key, partition=partition_for(key.encode(), 2, "crc32"))
    config = Config(name="q", bootstrap_servers="memory", input_topics=["in"],
                    key_serde="str", query_port=0, query_partitioner="crc32",
                    input_partitions=[0])
    processor = TopicProcessor(config, KeyCount, stores=[MemoryTable("counts")],
                               clients=broker.clients(config),
                               views={"/top": top, "/broken": failing})
    processor.run_loop(until_caught_up=True)
    yield processor
    processor.close()


def _http(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_reads_match_the_table(served: TopicProcessor) -> None:
    """Values over HTTP, through the client and through query() equal the table the run
    left; scans page through every key once."""
    store = served.tables._open_stores()[0]["counts"]
    table = store.query_scan(Scan(limit=100)).items
    held = [f"k{i}" for i in range(6) if partition_for(f"k{i}".encode(), 2, "crc32") == 0]
    assert sorted(table) == [(key, 10) for key in held]
    client = QueryClient(served.endpoint or "")
    for key, count in table:
        assert served.query("counts", key) == count
        assert client.get("counts", key) == count
    assert sorted(client.scan("counts", page=2)) == sorted(table)
    assert list(client.scan("counts", prefix="k")) == sorted(table)
    status, body = _http(f"{served.endpoint}/tables")
    assert status == 200 and body["tables"][0]["partitions"] == [0]


def test_http_errors_are_clear(served: TopicProcessor) -> None:
    """Missing key 404, unknown table 404, bad limit 400, all naming what is wrong."""
    nobody = next(f"nobody{i}" for i in range(50)
                  if partition_for(f"nobody{i}".encode(), 2, "crc32") == 0)  # held here
    status, body = _http(f"{served.endpoint}/tables/counts/{nobody}")
    assert (status, body["error"]) == (404, "KeyNotFoundError")
    assert f"no value for key {nobody!r}" in body["message"]
    status, body = _http(f"{served.endpoint}/tables/nope")
    assert (status, body["error"]) == (404, "UnknownTableError")
    assert "its tables: ['counts']" in body["message"]
    status, body = _http(f"{served.endpoint}/tables/counts?limit=zero")
    assert (status, body["message"]) == (400, "parameter limit='zero' is not an integer")
    client = QueryClient(served.endpoint or "")
    with pytest.raises(KeyNotFoundError):
        client.get("counts", nobody)
    with pytest.raises(UnknownTableError):
        client.get("nope", "k1", key_serde="str")


def test_key_of_a_partition_not_held_is_421(served: TopicProcessor) -> None:
    """This instance holds partition 0 only; a key of partition 1 is not here, and no
    instance announced partition 1 (the in-memory broker has no group offsets API)."""
    key = next(f"k{i}" for i in range(6) if partition_for(f"k{i}".encode(), 2, "crc32") == 1)
    with pytest.raises(NotHereError, match=r"input partition 1 .crc32 partitioner"):
        served.query("counts", key)


@pytest.mark.parametrize("partition", [2, 99999, -3])
def test_a_partition_the_input_lacks_is_a_bad_parameter(served: TopicProcessor,
                                                        partition: int) -> None:
    """``partition=`` past the input's count or negative answers 400 naming the parameter
    and the valid range, for a scan and a key alike; partition 1 (real, held elsewhere)
    is still 421."""
    message = (f"parameter partition={partition} is out of range: the input partitions "
               "of processor 'q' are 0..1")
    for path in (f"counts?partition={partition}", f"counts/k1?partition={partition}"):
        status, body = _http(f"{served.endpoint}/tables/{path}")
        assert (status, body["error"], body["message"]) == (400, "BadQueryError", message)
    with pytest.raises(BadQueryError, match=re.escape(message)):
        served.tables.scan("counts", Scan(), partition=partition)
    status, body = _http(f"{served.endpoint}/tables/counts?partition=1")
    assert (status, body["error"]) == (421, "NotHereError")


def test_views(served: TopicProcessor) -> None:
    """A registered view answers its path with the tables; a failing view answers 500
    and the loop is unharmed."""
    status, body = _http(f"{served.endpoint}/top?n=2")
    assert status == 200 and len(body["top"]) == 2 and body["top"][0][1] == 10
    status, body = _http(f"{served.endpoint}/broken")
    assert status == 500 and body == {"error": "RuntimeError", "status": 500,
                                      "message": "view /broken raised: boom"}
    served.run_loop(until_caught_up=True)


def test_view_paths_are_checked() -> None:
    """Views need the HTTP server, an absolute path, and a path kasper_py does not own."""
    broker = InMemoryBroker()
    broker.create_topic("in")
    config = Config(name="q", bootstrap_servers="memory", input_topics=["in"])
    with pytest.raises(ValueError, match=r"set Config\.query_port"):
        TopicProcessor(config, KeyCount, clients=broker.clients(config), views={"/v": top})
    served = Config(name="q", bootstrap_servers="memory", input_topics=["in"], query_port=0)
    for path, problem in (("/tables/x", "taken by kasper_py's own /tables"),
                          ("v", "starts with '/'")):
        with pytest.raises(ValueError, match=problem):
            TopicProcessor(served, KeyCount, clients=broker.clients(served), views={path: top})
