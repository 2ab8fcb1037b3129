"""Shared fixtures. Integration tests use the broker from `kasper stack up` (or the
cluster named by KASPER_BOOTSTRAP_SERVERS) with a fresh topic and group per test."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

pytest.register_assert_rewrite("tests.container_stack")
from tests.container_stack import on_containers  # noqa: E402 - after register_assert_rewrite
from tests.kafka_clients import AdminClient, Consumer, Producer  # noqa: E402
from tests.on_demand import on_demand  # noqa: E402

pytest_plugins = ["tests.container_stack", "kasper_py.testing.container_fixtures"]

# Under `pytest -n N --dist loadgroup` (make test), a file's tests run on one worker, in
# order; files that share a server they start and stop, or a session-wide Spark cluster,
# share a group so they never run at the same time on two workers.
SHARED_GROUPS = {"test_stack_jaeger.py": "jaeger", "test_tracing_otlp.py": "jaeger",
                 "test_stack.py": "stack", "test_stack_anywhere.py": "stack",
                 # each checks that no container is left behind, which another file's
                 # container started meanwhile would break
                 "test_containers.py": "containers", "test_store_containers.py": "containers",
                 # its local[2] session runs after the Spark cluster's tests, not beside them
                 "test_reprocess_columnar.py": "spark"}
SPARK_GROUPS = {"spark_master": "spark", "spark_cluster": "spark",
                "own_spark_cluster": "spark-own"}  # one private cluster at a time


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        spark = [SPARK_GROUPS[f] for f in getattr(item, "fixturenames", ()) if f in SPARK_GROUPS]
        group = spark[0] if spark else SHARED_GROUPS.get(item.path.name, item.path.name)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put structlog and the root logger back as they were after each test: the CLI,
    run in-process, configures logging onto pytest's captured stream, which is closed
    once the test ends (a later log line would raise on it)."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def _bootstrap() -> str:
    env = os.environ.get("KASPER_BOOTSTRAP_SERVERS")
    if env:
        return env
    from kasper_py.stack import kafka_bootstrap

    return kafka_bootstrap()


@pytest.fixture(scope="session")
def bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of the test broker, the stack's Kafka started when it is not
    running; fails (not skips) when none answers. With ``KASPER_STACK=containers`` a
    broker in a container instead (tests/container_stack.py)."""
    if on_containers():
        return str(request.getfixturevalue("container_bootstrap"))
    servers = _bootstrap()
    on_demand("kafka", servers, lambda: AdminClient({"bootstrap.servers": servers})
              .list_topics(timeout=15), external="KASPER_BOOTSTRAP_SERVERS" in os.environ)
    return servers


@pytest.fixture
def hung_server() -> Iterator[tuple[str, int]]:
    """(host, port) of a server that takes connections and never answers: a listening
    socket nobody accepts from (the kernel completes the handshake and buffers what is
    sent; no reply ever comes), as a paused (SIGSTOP) or wedged server looks."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield "127.0.0.1", int(listener.getsockname()[1])


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Makes names unique to this test run: topics, groups, processor names."""
    run = uuid.uuid4().hex[:10]
    return lambda prefix: f"{prefix}-{run}"


@pytest.fixture
def new_topic(bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[Callable[..., str]]:
    """Creates fresh topics and deletes them after the test."""
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created: list[str] = []

    def create(prefix: str = "topic", partitions: int = 1, **config: str) -> str:
        name = unique_name(prefix)
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])
        futures[name].result(30)
        created.append(name)
        return name

    yield create
    if created:
        for future in admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # cleanup of a test topic is best-effort
                future.result(30)


@pytest.fixture
def kafka(bootstrap: str) -> KafkaHelper:
    """Produce test input, read output, and read a group's committed offsets."""
    return KafkaHelper(bootstrap)


class KafkaHelper:
    """Small, synchronous helpers over confluent-kafka for assertions in tests."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def produce(self, topic: str, records: list[tuple[Any, ...]] | list[Any],
                partition: int | None = None, timestamp: int | None = None) -> None:
        """Produce values, (key, value) pairs or (key, value, timestamp ms) triples, and
        wait for every ack; ``timestamp`` (ms) is the create time of records without one."""
        # idempotent: a batch retried (a broker just started, a new topic's leader not yet
        # known) cannot land after the ones sent behind it, so each partition holds the
        # records in the order given, which tests compare outputs against
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                             "partitioner": "murmur2_random", "enable.idempotence": True})
        errors: list[Any] = []
        for record in records:
            key, value, *stamp = record if isinstance(record, tuple) else (None, record)
            kwargs: dict[str, Any] = {"key": key, "value": value,
                                      "on_delivery": lambda err, _m: err and errors.append(err)}
            if stamp or timestamp is not None:
                kwargs["timestamp"] = stamp[0] if stamp else timestamp
            if partition is not None:
                kwargs["partition"] = partition
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(60) == 0
        assert not errors, errors

    def read_all(self, topic: str, timeout: float = 30.0) -> list[Any]:
        """Every message of ``topic`` up to its current high watermarks."""
        from confluent_kafka import TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "kasper-tests-reader",
                             "enable.auto.commit": False})
        try:
            meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
            ends: dict[int, int] = {}
            tps = []
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                           timeout=timeout)
                if high > low:
                    ends[p] = high
                    tps.append(TopicPartition(topic, p, low))
            consumer.assign(tps)
            out: list[Any] = []
            deadline = time.monotonic() + timeout
            while ends:
                # consume() waits for a full batch or its timeout, so poll in short steps.
                batch = consumer.consume(10000, 0.5)
                assert time.monotonic() < deadline, f"timed out reading {topic}: {ends} left"
                for msg in batch:
                    assert msg.error() is None, msg.error()
                    out.append(msg)
                # the position, not the last offset: a transactional topic ends in markers
                for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                    if tp.offset >= ends[tp.partition]:
                        ends.pop(tp.partition)
            return out
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed next offset per partition (None when nothing is committed).
        A group's coordinator may still be moving or loading when the group is new: that
        retriable answer is asked again."""
        from confluent_kafka import KafkaException, TopicPartition

        # read_uncommitted asks for the stable offsets without waiting: read_committed
        # (librdkafka's default) waits while a killed exactly-once loop's transaction
        # holds pending offsets, until its successor or the transaction timeout ends it.
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group,
                             "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    result = consumer.committed(
                        [TopicPartition(topic, p) for p in range(partitions)], timeout=30)
                    return {tp.partition: (tp.offset if tp.offset >= 0 else None)
                            for tp in result}
                except KafkaException as exc:
                    if not exc.args[0].retriable() or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            consumer.close()
