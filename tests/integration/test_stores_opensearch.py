"""OpenSearch tables on a real OpenSearch node and Kafka: values, scans and deletes as
documents; a bulk item refused fails the turn uncommitted; effectively-once exact under
repeated kill -9; the node unreachable mid-run and back; queries through `kasper run`."""
# ruff: noqa: PLR0917 - pytest passes fixtures positionally; tests take several

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    Sender,
    StoreError,
    StoreUnavailableError,
)
from kasper_py.query import QueryClient
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.opensearch import OpenSearchTable
from kasper_py.stores.query import Scan

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402 - after register_assert_rewrite
    OpenedCounts, TcpProxy, TurnCounter, free_port, kill_randomly_then_finish, produce_words,
    produce_words_and_a_delete, read_counts, run_until_caught_up, store_config, wait_for,
    worker_args)
from stores_worker import WordCount  # isort: skip  # noqa: E402
from test_cli import cli_env, kasper  # isort: skip  # noqa: E402
from test_queries_cli import _config, _expected, _held, _records  # isort: skip  # noqa: E402
from test_queries_cli import running as kasper_runs  # isort: skip  # noqa: E402, F401 - a fixture

pytest_plugins = ["conftest_stores"]
pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


def _document(url: str, index: str, document_id: str) -> dict[str, Any]:
    """``GET /<index>/_doc/<id>`` as OpenSearch answers it (``found`` false: a 404)."""
    quoted = urllib.parse.quote(document_id, safe="")
    try:
        with urllib.request.urlopen(f"{url}/{index}/_doc/{quoted}", timeout=10) as reply:
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return dict(json.loads(exc.read()))


def _offsets(url: str, index: str, partition: int) -> dict[str, int]:
    return dict(_document(url, index, f"#offsets/{partition}")["_source"]["offsets"])


@pytest.fixture(autouse=True)
def delete_indices(opensearch_url: str, unique_name: Any) -> Iterator[None]:
    """Deletes the indices the test's tables created (their names hold its run id)."""
    yield
    run = unique_name("").lower()
    with urllib.request.urlopen(f"{opensearch_url}/_cat/indices?h=index", timeout=30) as reply:
        indices = [name for name in reply.read().decode().split() if run in name]
    for index in indices:
        request = urllib.request.Request(f"{opensearch_url}/{index}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture
def opensearch_proxy(opensearch_url: str) -> Iterator[TcpProxy]:
    """A started proxy in front of the stack's OpenSearch: stopping it is the node
    going away, starting it again its return."""
    parts = urlsplit(opensearch_url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 9200))
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("effectively_once", [False, True])
def test_word_count_values_scans_and_deletes(bootstrap, new_topic, kafka, unique_name,
                                             opensearch_url, effectively_once) -> None:
    """Counts over two partitions equal the input's, each a document ``<p>/<word>`` of
    the index ``<name>-counts`` holding the JSON value; deletes remove documents; a turn
    costs at most one _mget and one _bulk per partition; scans page in key order."""
    topic, name = new_topic("words", partitions=2), unique_name("os-wc")
    words = [f"w{i % 23}" for i in range(800)]
    produce_words_and_a_delete(kafka, topic, words)
    factory = OpenedCounts()

    table = OpenSearchTable("counts", url=opensearch_url, effectively_once=effectively_once)
    cfg, observer = store_config(bootstrap, name, topic), TurnCounter()
    run_until_caught_up(cfg, table, factory, observer=observer)
    assert read_counts(OpenSearchTable("counts", url=opensearch_url), cfg, 2,
                       [*words, "gone"]) == Counter(words)
    index = f"{name}-counts".lower()
    document = _document(opensearch_url, index, "0/w0")
    assert document["_source"] == {"key": "w0", "partition": 0,
                                   "value": Counter(words[0::2])["w0"]}
    assert not _document(opensearch_url, index, "0/gone")["found"]
    opening = 2 if effectively_once else 0  # each partition's offsets document
    assert factory.round_trips <= 2 * 2 * observer.turns + opening + 1
    if effectively_once:
        assert _offsets(opensearch_url, index, 0) == {topic: 402}
        # externally versioned by the turn's next offset, not counted from 1 per write
        assert 200 <= document["_version"] <= 402
    _check_scans(opensearch_url, cfg, index, Counter(words[0::2]))


def _check_scans(url: str, config: Config, index: str, expected: Counter[str]) -> None:
    """Partition 0 scanned in pages of 5, by prefix and by range, once refreshed."""
    with urllib.request.urlopen(urllib.request.Request(f"{url}/{index}/_refresh",
                                                       method="POST"), timeout=10):
        pass
    table = OpenSearchTable("counts", url=url)
    store = table.open(StoreRuntime(config, 0))
    items, cursor = [], None
    while True:
        page = store.query_scan(Scan(cursor=cursor, limit=5))
        assert page.ordered
        items += page.items
        if (cursor := page.cursor) is None:
            break
    assert items == sorted(expected.items())
    assert dict(store.query_scan(Scan(prefix=b"w1")).items) == {
        k: n for k, n in expected.items() if k.startswith("w1")}
    assert [k for k, _ in store.query_scan(Scan(start=b"w2", end=b"w4")).items] == sorted(
        k for k in expected if "w2" <= k < "w4")
    table.close()


class JsonValues(MessageProcessor):
    """Writes each message's JSON value under its key in the table "docs"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.context.store("docs").put_many({m.key: json.loads(m.value) for m in messages})


@pytest.mark.parametrize("effectively_once", [False, True])
def test_a_refused_bulk_item_fails_the_turn_uncommitted(bootstrap, new_topic, kafka,
                                                        unique_name, opensearch_url,
                                                        effectively_once) -> None:
    """A document OpenSearch refuses (a string where its mapping holds a number) fails
    the flush with a StoreError naming the document and the reason; the batch's offsets
    are not committed, and an effectively-once table's offsets document stays at what
    was committed, so the batch is replayed, not skipped."""
    topic, name = new_topic("docs"), unique_name("os-refused")
    good = [(f"k{i}".encode(), json.dumps({"n": i}).encode()) for i in range(10)]
    kafka.produce(topic, [*good, (b"bad", b'{"n": "not a number"}')], partition=0)
    table = OpenSearchTable("docs", url=opensearch_url, effectively_once=effectively_once)
    cfg = store_config(bootstrap, name, topic, batch_size=5, key_serde="str")
    with pytest.raises(StoreError) as info:
        run_until_caught_up(cfg, table, JsonValues)
    text = str(info.value)
    assert "1 of 2 items failed" in text or "1 of 1 items failed" in text, text
    assert "document '0/bad'" in text and "mapper_parsing_exception" in text, text
    assert "batch not committed" in text
    assert kafka.committed(name, topic) == {0: 10}
    index = f"{name}-docs".lower()
    if effectively_once:
        assert _offsets(opensearch_url, index, 0) == {topic: 10}
    assert _document(opensearch_url, index, "0/k9")["_source"]["value"] == {"n": 9}


def test_effectively_once_is_exact_under_repeated_kill_minus_nine(
        bootstrap, new_topic, kafka, unique_name, opensearch_url) -> None:
    """SIGKILL at random moments, then run to the end: every count document is exact
    and each partition's offsets document equals its committed offset."""
    topic, name, batch_size, kills = new_topic("words", partitions=2), unique_name("os-kill"), 50, 3
    words = [f"w{i % 31}" for i in range(2000)]
    produce_words(kafka, topic, words, 2)
    args = worker_args("opensearch", bootstrap, name, topic, batch_size, "--opensearch-url",
                       opensearch_url, "--pause", "0.05", "--effectively-once")
    kill_randomly_then_finish(
        args, kills, lambda: sum(o or 0 for o in kafka.committed(name, topic, 2).values()),
        len(words))
    cfg = store_config(bootstrap, name, topic)
    assert read_counts(OpenSearchTable("counts", url=opensearch_url), cfg, 2,
                       words) == Counter(words)
    committed = kafka.committed(name, topic, 2)
    assert sum(committed.values()) == len(words)
    index = f"{name}-counts".lower()
    assert {p: _offsets(opensearch_url, index, p) for p in (0, 1)} == {
        p: {topic: committed[p]} for p in (0, 1)}


@pytest.mark.parametrize("effectively_once", [False, True])
def test_node_unreachable_mid_run_fails_the_turn_then_recovers(
        bootstrap, new_topic, kafka, unique_name, opensearch_proxy, effectively_once) -> None:
    """The node goes away between a turn's reads and its bulk: the loop raises
    StoreUnavailableError naming it, commits nothing of that batch, and once it is back
    a new run finishes with exact counts."""
    topic, name = new_topic("words"), unique_name("os-down")
    words = [f"w{i % 11}" for i in range(600)]
    produce_words(kafka, topic, words, 1)
    url = f"http://127.0.0.1:{opensearch_proxy.port}"
    failed_at: list[int] = []

    def stop_node_once(messages: list[Message]) -> None:
        if not failed_at and messages[0].offset >= 200:
            failed_at.append(messages[0].offset)
            opensearch_proxy.stop()

    def table() -> OpenSearchTable:
        return OpenSearchTable("counts", url=url, effectively_once=effectively_once,
                               retries=2, backoff=0.05)

    cfg = store_config(bootstrap, name, topic, batch_size=100)
    with pytest.raises(StoreUnavailableError) as info:
        run_until_caught_up(cfg, table(), lambda c: WordCount(c, hook=stop_node_once))
    text = str(info.value)
    assert f"opensearch {url} unreachable: _bulk" in text, text
    assert "batch not committed" in text and f"{topic}[0] offsets {failed_at[0]}.." in text
    assert kafka.committed(name, topic) == {0: failed_at[0]}
    opensearch_proxy.start()
    run_until_caught_up(cfg, table())
    assert kafka.committed(name, topic) == {0: 600}
    assert read_counts(table(), cfg, 1, words) == Counter(words)


def test_kasper_run_serves_an_opensearch_table(bootstrap, new_topic, kafka, unique_name,
                                               tmp_path, opensearch_url, kasper_runs) -> None:  # noqa: F811
    """``kasper run --stores`` with an OpenSearch table serves it on the query port:
    every value with the client and ``kasper query``, and a prefix scan once refreshed."""
    topic = new_topic("os-q-in", partitions=3)
    kafka.produce(topic, _records())
    port = free_port()
    config = _config(tmp_path, unique_name("os-q"), topic, query_port=port)
    env = {**cli_env(bootstrap), "KASPER_OPENSEARCH_URL": opensearch_url}
    process = kasper_runs("run", "queries_module:Count", "--stores",
                      "queries_module:opensearch_stores", "--app-dir", str(HERE),
                      "--config", config, env=env)
    client = QueryClient(f"http://127.0.0.1:{port}")
    wait_for(lambda: _held(client) == _expected(), "every count served", timeout=90)
    assert {key: client.get("counts", key) for key in _expected()} == _expected()
    answer = kasper("query", "--url", f"http://127.0.0.1:{port}", "counts", "user-7", env=env)
    assert (answer.returncode, answer.stdout) == (0, "4\n"), answer.stderr
    answer = kasper("query", "--url", f"http://127.0.0.1:{port}", "counts",
                    "--prefix", "user-2", env=env)
    assert answer.returncode == 0, answer.stderr
    assert dict(map(json.loads, answer.stdout.splitlines())) == {
        k: n for k, n in _expected().items() if k.startswith("user-2")}
    assert process.poll() is None
