"""Cassandra tables on a real Cassandra and Kafka: schema creation, exact word counts,
kill -9 bounds with and without effectively-once, Cassandra going away mid-turn (a proxy
in front of it is stopped), and fencing."""
# ruff: noqa: PLR0917 - pytest passes fixtures positionally; tests take several

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from cassandra.cluster import Cluster

from kasper_py import (
    Config,
    StoreError,
    TopicProcessor,
)
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.cassandra import CassandraTable

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402 - after register_assert_rewrite
    OpenedCounts, TcpProxy, TurnCounter, WORDS, assert_down_mid_turn_stops_uncommitted,
    check_discard_pending, kill_randomly_then_finish, produce_words,
    produce_words_and_a_delete, read_counts, store_config, worker_args)

pytest_plugins = ["conftest_stores"]
pytestmark = [pytest.mark.integration, pytest.mark.cassandra]

KEYSPACE = "kasper_tests"
def table(contact: tuple[str, int], **kwargs: Any) -> CassandraTable:
    host, port = contact
    return CassandraTable("counts", contact_points=[host], port=port, keyspace=KEYSPACE,
                          **kwargs)


def test_keyspace_and_table_are_created_with_the_given_replication(cassandra_contact) -> None:
    """An absent keyspace is created with the configured replication, and the table with
    one Cassandra partition per (processor, input partition)."""
    keyspace = f"kasper_t_{uuid.uuid4().hex[:12]}"
    host, port = cassandra_contact
    spec = CassandraTable("counts", contact_points=[host], port=port, keyspace=keyspace,
                          replication={"class": "NetworkTopologyStrategy", "datacenter1": 1})
    cfg = Config(name="schema", bootstrap_servers="unused:0", input_topics=["t"])
    store = spec.open(StoreRuntime(cfg, 0))
    store.put("k", {"n": 1})
    store.flush({})
    assert store.get("k") == {"n": 1}
    spec.close()
    cluster = Cluster([host], port=port)
    session = cluster.connect()
    try:
        row = session.execute("SELECT replication FROM system_schema.keyspaces "
                              "WHERE keyspace_name = %s", (keyspace,)).one()
        assert row.replication["class"].endswith("NetworkTopologyStrategy")
        assert row.replication["datacenter1"] == "1"
        columns = {r.column_name: r.kind for r in session.execute(
            "SELECT column_name, kind FROM system_schema.columns "
            "WHERE keyspace_name = %s AND table_name = 'counts'", (keyspace,))}
        assert columns == {"prefix": "partition_key", "partition": "partition_key",
                           "key": "clustering", "value": "regular", "offsets": "static"}
    finally:
        session.execute(f"DROP KEYSPACE {keyspace}")
        cluster.shutdown()


@pytest.mark.parametrize("effectively_once", [False, True])
def test_word_count_is_exact(bootstrap, new_topic, kafka, unique_name, cassandra_contact,
                             effectively_once) -> None:
    """Counts over two partitions equal the input's, deletes remove rows, and a turn
    costs at most two round trips (concurrent waves) per partition."""
    topic, name = new_topic("words", partitions=2), unique_name("cass-wc")
    produce_words_and_a_delete(kafka, topic, WORDS)
    factory = OpenedCounts()

    cfg, observer = store_config(bootstrap, name, topic), TurnCounter()
    processor = TopicProcessor(cfg, factory, observer=observer,
                               stores=[table(cassandra_contact,
                                             effectively_once=effectively_once)])
    processor.run_loop(until_caught_up=True)
    processor.close()
    counts = read_counts(table(cassandra_contact), cfg, 2, [*WORDS, "gone"])
    assert counts == Counter(WORDS)
    opening = 2 if effectively_once else 0  # each partition reads its offsets once
    assert factory.round_trips <= 2 * 2 * observer.turns + opening
    if effectively_once:
        reread = table(cassandra_contact, effectively_once=True)
        assert reread.open(StoreRuntime(cfg, 0)).applied_offsets() == {(topic, 0): 1502}
        reread.close()


@pytest.mark.parametrize("effectively_once", [False, True])
def test_kill_minus_nine_never_undercounts(bootstrap, new_topic, kafka, unique_name,
                                           cassandra_contact, effectively_once) -> None:
    """SIGKILL at random moments, then run to the end: no word is undercounted; the
    overcount is at most one batch per kill, and zero with effectively-once."""
    topic, name, batch_size, kills = new_topic("words", partitions=2), unique_name("kill"), 100, 3
    words = [f"w{i % 53}" for i in range(6000)]
    produce_words(kafka, topic, words, 2)
    host, port = cassandra_contact
    options = ["--cassandra", f"{host}:{port}", "--keyspace", KEYSPACE, "--pause", "0.05"]
    args = worker_args("cassandra", bootstrap, name, topic, batch_size, *options,
                       *(["--effectively-once"] if effectively_once else []))
    kill_randomly_then_finish(
        args, kills, lambda: sum(o or 0 for o in kafka.committed(name, topic, 2).values()),
        len(words))
    counts = read_counts(table(cassandra_contact), store_config(bootstrap, name, topic), 2, words)
    expected = Counter(words)
    assert all(counts[w] >= n for w, n in expected.items()), expected - counts
    if effectively_once:
        assert counts == expected
    else:
        assert sum(counts.values()) - len(words) <= kills * batch_size
    assert sum(kafka.committed(name, topic, 2).values()) == len(words)


@pytest.mark.parametrize("effectively_once", [False, True])
def test_server_down_mid_turn_stops_uncommitted(bootstrap, new_topic, kafka, unique_name,
                                               cassandra_proxy: TcpProxy,
                                               effectively_once) -> None:
    """Cassandra becomes unreachable between a turn's reads and its flush: the loop
    raises StoreUnavailableError naming the contact point, commits nothing of that
    batch, and once Cassandra is reachable again a new run finishes with exact counts."""
    proxied = ("127.0.0.1", cassandra_proxy.port)

    def spec() -> CassandraTable:
        return table(proxied, effectively_once=effectively_once, retries=2, backoff=0.05,
                     timeout=3.0)

    assert_down_mid_turn_stops_uncommitted(
        kafka, bootstrap, new_topic("words"), unique_name("down"), spec=spec,
        stop=cassandra_proxy.stop, start=cassandra_proxy.start,
        unreachable=f"cassandra 127.0.0.1:{cassandra_proxy.port} unreachable")


def test_effectively_once_fences_a_stale_writer(cassandra_contact, unique_name) -> None:
    """A store whose offsets are stale is refused with a "fenced" StoreError and writes
    nothing; a batch whose offsets are already applied is a no-op."""
    cfg = Config(name=unique_name("fence"), bootstrap_servers="unused:0", input_topics=["t"])
    specs = [table(cassandra_contact, effectively_once=True) for _ in range(3)]
    current, stale = (spec.open(StoreRuntime(cfg, 0)) for spec in specs[:2])
    current.put("k", 1)
    current.flush({("t", 0): 10})
    stale.put("k", 99)
    with pytest.raises(StoreError, match="fenced"):
        stale.flush({("t", 0): 20})
    replay = specs[2].open(StoreRuntime(cfg, 0))
    assert replay.applied_offsets() == {("t", 0): 10}
    replay.put("k", 1000)
    replay.flush({("t", 0): 10})
    assert replay.get("k") == 1
    for spec in specs:
        spec.close()


def test_discard_pending_drops_buffered_writes(cassandra_contact, unique_name) -> None:
    """Buffered writes dropped by discard_pending never reach the server."""
    cfg = Config(name=unique_name("discard"), bootstrap_servers="unused:0", input_topics=["t"])
    spec = table(cassandra_contact)
    check_discard_pending(spec, cfg)
    spec.close()
