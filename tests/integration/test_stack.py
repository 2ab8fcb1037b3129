"""The local stack (`python -m kasper_py.stack`) against real Kafka, Redis and Cassandra.

Uses the stack of $KASPER_STACK_DIR (default ./.kasper-stack): components already
running are reused and left running; the ones these tests start are stopped again.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasper_py import stack
from kasper_py.stack import StackError, _components
from kasper_py.stack._settings import Settings
from tests.kafka_clients import AdminClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# The first run may resolve jars from Maven Central and apt-get install redis-server.
KAFKA_AND_REDIS = ["kafka", "redis"]


def _running(names: list[str]) -> set[str]:
    return {entry.name for entry in stack.status() if entry.running and entry.name in names}


@pytest.fixture(scope="module")
def kafka_and_redis() -> Iterator[list[stack.ComponentStatus]]:
    """Kafka and Redis up for the module; stops only what this fixture had to start."""
    already_running = _running(KAFKA_AND_REDIS)
    statuses = stack.up(KAFKA_AND_REDIS)
    yield statuses
    started_here = [name for name in KAFKA_AND_REDIS if name not in already_running]
    if started_here:
        stack.down(started_here)


def test_up_twice_leaves_running_components_alone(
    kafka_and_redis: list[stack.ComponentStatus], capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `up` starts nothing new: same pids, and it says they were already running."""
    again = stack.up(KAFKA_AND_REDIS)

    assert [entry.pid for entry in again] == [entry.pid for entry in kafka_and_redis]
    output = capsys.readouterr().out
    assert "kafka: already running" in output
    assert "redis: already running" in output


def test_status_reports_running_with_configured_ports(
    kafka_and_redis: list[stack.ComponentStatus],
) -> None:
    """`status` shows Kafka and Redis running, each with a pid and its configured address."""
    by_name = {entry.name: entry for entry in stack.status()}

    kafka, redis = by_name["kafka"], by_name["redis"]
    assert kafka.running and kafka.pid is not None
    assert redis.running and redis.pid is not None
    assert kafka.address == f"127.0.0.1:{stack.kafka_bootstrap().rsplit(':', 1)[1]}"
    assert f"redis://{redis.address}/0" == stack.redis_url()


def test_status_command_prints_every_component(
    kafka_and_redis: list[stack.ComponentStatus], capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m kasper_py.stack status` exits 0 and prints one line per component."""
    assert stack.main(["status"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "kafka", "schema-registry", "redis", "cassandra", "prometheus", "spark-master",
        "spark-worker-1", "spark-worker-2", "jaeger", "opensearch", "postgres", "podman"]
    assert "running" in lines[0]


def test_kafka_answers_metadata_on_bootstrap(
    kafka_and_redis: list[stack.ComponentStatus],
) -> None:
    """A real metadata request to kafka_bootstrap() lists the broker."""
    metadata = AdminClient({"bootstrap.servers": stack.kafka_bootstrap()}).list_topics(timeout=10)

    assert len(metadata.brokers) == 1


def test_redis_answers_ping(kafka_and_redis: list[stack.ComponentStatus]) -> None:
    """redis-py reaches the stack's Redis through redis_url() and gets PONG."""
    redis = pytest.importorskip("redis")

    client = redis.Redis.from_url(stack.redis_url())
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_failed_start_names_the_log_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the port is taken, `up` fails with the log's path and tail, and leaves no pid file."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        monkeypatch.setenv("KASPER_STACK_DIR", str(tmp_path))
        monkeypatch.setenv("KASPER_REDIS_PORT", str(squatter.getsockname()[1]))

        with pytest.raises(StackError) as failure:
            stack.up(["redis"])

    log_file = tmp_path / "redis" / "redis.log"
    assert str(log_file) in str(failure.value)
    assert "already listens" in str(failure.value)
    assert not (tmp_path / "redis" / "redis.pid").exists()
    assert not any(entry.running for entry in stack.status())


@pytest.mark.cassandra
def test_schema_registry_answers_the_confluent_api() -> None:
    """`up schema-registry` (reused when running) serves the Confluent API at
    schema_registry_url(): confluent-kafka's client lists its subjects."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    (status,) = stack.up(["schema-registry"])
    assert status.running and status.log_file.is_file()
    assert stack.schema_registry_url().endswith(f"{status.address}/apis/ccompat/v7")
    assert isinstance(SchemaRegistryClient({"url": stack.schema_registry_url()})
                      .get_subjects(), list)


def test_cassandra_answers_cql() -> None:
    """Cassandra from the stack answers a CQL query on cassandra_contact()."""
    cluster_module = pytest.importorskip("cassandra.cluster")
    started_here = not _running(["cassandra"])
    stack.up(["cassandra"])
    host, port = stack.cassandra_contact()
    cluster = cluster_module.Cluster([host], port=port)
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        assert row.release_version.startswith("5.0")
    finally:
        cluster.shutdown()
        if started_here:
            stack.down(["cassandra"])


def test_opensearch_answers_rest() -> None:
    """OpenSearch from the stack answers ``GET /`` on opensearch_url() with its version,
    a single-node cluster of its own name."""
    started_here = not _running(["opensearch"])
    (status,) = stack.up(["opensearch"])
    try:
        assert stack.opensearch_url() == f"http://{status.address}"
        with urllib.request.urlopen(stack.opensearch_url(), timeout=10) as reply:
            node = json.loads(reply.read())
        assert node["version"]["number"] == "2.19.6"
        assert node["cluster_name"] == "kasper-stack"
    finally:
        if started_here:
            stack.down(["opensearch"])


def test_kafka_storage_formats_with_a_cluster_id_starting_with_a_dash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster id is URL-safe base64 of random bytes, so 1 in 64 starts with "-": the
    storage tool must take it as the id, not as an option (it once failed `make test`).
    The jars come from the per-user cache, shared with the stack's own Kafka."""
    kafka = _components.Kafka(dataclasses.replace(Settings.load(), stack_dir=tmp_path))
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 "-AAA..."
    monkeypatch.setattr(_components.uuid, "uuid4", lambda: dashed)
    kafka.prepare()
    meta = (kafka.data_dir / "meta.properties").read_text()
    assert "cluster.id=-AAAAAAAAAAAAAAAAAAAAA" in meta
