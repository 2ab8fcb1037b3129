"""Every network call of the loop gives up in bounded time with a named error (a
KasperError naming the server and how long it waited), against servers that take
connections and never answer (``hung_server``): Kafka's metadata, offsets, watermarks,
commit, acks and transactions, topic creation, admin requests, Redis, Cassandra and
the query client. The schema registry's own test is in test_registry_serdes_unit.py.
The bounds asserted are generous: these tests catch a wait that never ends."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.exceptions import (
    BrokerUnreachableError,
    CommitError,
    ConsumeError,
    ProduceError,
    QueryUnavailableError,
    StoreUnavailableError,
    TopicError,
)
from kasper_py.kafka import consumer as consumer_module
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.producer import OutputProducer
from kasper_py.kafka.topics import TopicSpec
from kasper_py.query import QueryClient
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.redis import RedisTable

pytestmark = pytest.mark.timeout(180)

GENEROUS = 60.0
"""Seconds any one of these waits may take on a loaded machine (their bounds: 1-3 s)."""


@pytest.fixture
def config(hung_server: tuple[str, int]) -> Config:
    """A processor whose broker is the hung server; a 1 s delivery timeout and a 2 s
    session timeout (librdkafka's wait for a group coordinator)."""
    return Config(name="hung", bootstrap_servers="{}:{}".format(*hung_server),
                  input_topics=["t"], delivery_timeout=1.0,
                  consumer_overrides={"session.timeout.ms": 2000})


def raised(error: type[Exception], call: Any, *args: Any) -> str:
    """The text of ``error``, which ``call(*args)`` must raise within ``GENEROUS``."""
    started = time.monotonic()
    with pytest.raises(error) as info:
        call(*args)
    assert time.monotonic() - started < GENEROUS
    return str(info.value)


def test_consumer_metadata_offsets_watermarks_and_commit(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's consumer: metadata, committed offsets and watermarks wait their
    timeout (30 s, 1 s here); a commit waits session.timeout.ms for a coordinator."""
    monkeypatch.setattr(consumer_module, "_METADATA_TIMEOUT", 1.0)
    servers = config.bootstrap_servers
    consumer = InputConsumer(config)
    try:
        text = raised(TopicError, consumer.partition_count)
        assert f"cannot read metadata from {servers} within 1s" in text
        text = raised(ConsumeError, consumer.committed, [("t", 0)])
        assert f"(asked {servers}, waiting up to 1s)" in text
        text = raised(ConsumeError, consumer.watermarks, ("t", 0))
        assert f"watermarks of t[0] on {servers} (waited up to 1s)" in text
        text = raised(CommitError, consumer.commit, {("t", 0): 5})
        assert f"commit of group 'hung' on {servers} failed" in text
        assert "session.timeout.ms for a coordinator" in text
    finally:
        consumer.close()


def test_producer_metadata_and_acks(config: Config) -> None:
    """The loop's producer: a topic's metadata and the acks wait ``delivery_timeout``."""
    servers = config.bootstrap_servers
    producer = OutputProducer(config)
    try:
        text = raised(ProduceError, producer.missing_topics, ["out"])
        assert f"metadata of topic 'out' from {servers} within 1s" in text
        producer.produce([("out", b"v")])
        text = raised(ProduceError, producer.wait_for_acks)  # librdkafka's or ours, first
        assert f"no ack from {servers} within 1s, delivery_timeout" in text or \
            f"1 messages were not acknowledged by {servers} within 1s" in text
    finally:
        producer.close(discard=True)


def test_transactions_wait_the_delivery_timeout(hung_server: tuple[str, int]) -> None:
    """Exactly-once: taking over the transactional id waits ``delivery_timeout``."""
    servers = "{}:{}".format(*hung_server)
    config = Config(name="hung-eos", bootstrap_servers=servers, input_topics=["t"],
                    delivery_timeout=1.0, processing_guarantee="exactly_once")
    producer = OutputProducer(config)
    try:
        text = raised(CommitError, producer.init_transactions)
        assert f"taking over the transactional id on {servers} failed (waited up to 1s)" \
            in text
    finally:
        producer.close(discard=True)


def test_admin_requests_and_topic_creation(config: Config) -> None:
    """Admin requests wait the admin's timeout; creating topics its own."""
    servers = config.bootstrap_servers
    with KafkaAdmin(config, timeout=1.0, consumer=False) as admin:
        text = raised(BrokerUnreachableError, admin.metadata)
        assert f"reading metadata on {servers} failed within 1s" in text
        text = raised(BrokerUnreachableError, admin.group_notes, "t", 1)
        assert f"reading the offsets of group 'hung' on {servers}" in text
        absent = SimpleNamespace(topics={})  # metadata as read before: no such topic
        text = raised(TopicError, lambda: admin.ensure([TopicSpec("new", "output", 1)],
                                                       metadata=absent))
    assert "cannot create topic 'new'" in text and "1s" in text


def test_stores(hung_server: tuple[str, int]) -> None:
    """Redis and Cassandra: each attempt waits the table's ``timeout``, then
    StoreUnavailableError after the retries, naming the server and the wait."""
    host, port = hung_server
    runtime = StoreRuntime(Config(name="p", bootstrap_servers="unused:0",
                                  input_topics=["t"]), 0)
    redis_table = RedisTable("counts", url=f"redis://{host}:{port}/0", timeout=0.5,
                             retries=1, backoff=0.01)
    store = redis_table.open(runtime)
    try:
        text = raised(StoreUnavailableError, store.get_many, ["k"])
        assert f"redis redis://{host}:{port}/0 unreachable" in text
        assert "failed 2 times (each waiting up to 0.5s)" in text
    finally:
        redis_table.close()
    cassandra = CassandraTable("counts", contact_points=[host], port=port, timeout=0.5,
                               retries=0, keyspace="hung")
    try:
        text = raised(StoreUnavailableError, cassandra.open, runtime)
        assert f"cassandra {host}:{port} unreachable" in text
        assert "(each waiting up to 0.5s)" in text
    finally:
        cassandra.close()


def test_query_client(hung_server: tuple[str, int]) -> None:
    """A query endpoint that never answers: QueryUnavailableError naming it and the wait."""
    url = "http://{}:{}".format(*hung_server)
    client = QueryClient(url, timeout=0.5)
    text = raised(QueryUnavailableError, lambda: client.get("counts", "k", key_serde="str"))
    assert f"no query endpoint answered within 0.5s: {url}" in text
