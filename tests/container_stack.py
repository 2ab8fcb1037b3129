"""The integration suite against servers in containers: with ``KASPER_STACK=containers``
the ``bootstrap``, ``redis_url``, ``cassandra_contact``, ``postgres_url`` and
``opensearch_url`` fixtures hand out a Kafka, a Redis, a Cassandra, a PostgreSQL and an
OpenSearch started in containers (kasper_py.testing.containers) once per session,
instead of the local stack's processes; the same tests run. Loaded as a plugin by
tests/conftest.py, beside kasper_py.testing.container_fixtures, whose fixtures these
build on.

Where no container engine answers, those tests skip with what to install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from kasper_py._support.ports import ephemeral_range
from kasper_py.testing.containers import (
    CassandraContainer,
    ContainerEngineError,
    KafkaContainer,
    OpenSearchContainer,
    PostgresContainer,
    RedisContainer,
    docker_client,
)


def on_containers() -> bool:
    """True when this run's servers are containers (``KASPER_STACK=containers``)."""
    return os.environ.get("KASPER_STACK", "").strip().lower() == "containers"


@pytest.fixture(scope="session")
def engine() -> Any:
    """The engine's docker-py client, for tests about containers; they skip (naming what
    to install) where no engine answers."""
    try:
        return docker_client()
    except ContainerEngineError as exc:
        pytest.skip(str(exc))


def of_this_process(engine: Any, command: str) -> set[str]:
    """The ids of the containers this process started whose command names ``command``
    (the engine's own list: other tests' containers, started meanwhile, are not counted)."""
    from kasper_py.testing.containers import OWNER_LABEL

    return {c.id for c in engine.containers.list(
        all=True, sparse=True, filters={"label": f"{OWNER_LABEL}={os.getpid()}"})
        if command in str(c.attrs.get("Command", ""))}


def exists(engine: Any, container_id: str) -> bool:
    """True while the engine still knows the container, running or not."""
    return any(c.id == container_id for c in engine.containers.list(all=True, sparse=True))


@pytest.fixture(scope="session")
def container_bootstrap(kafka_container: KafkaContainer) -> Iterator[str]:
    """The container broker's address, also set as ``KASPER_BOOTSTRAP_SERVERS`` for the
    session so workers and the CLI started by tests find it as the fixtures do."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KASPER_BOOTSTRAP_SERVERS", kafka_container.bootstrap_servers)
        yield kafka_container.bootstrap_servers


@pytest.fixture(scope="session")
def container_redis_url(redis_container: RedisContainer) -> Iterator[str]:
    """The container Redis's URL, also set as ``KASPER_REDIS_URL`` for the session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KASPER_REDIS_URL", redis_container.url)
        yield redis_container.url


@pytest.fixture(scope="session")
def container_cassandra_contact(
        cassandra_container: CassandraContainer) -> Iterator[tuple[str, int]]:
    """The container Cassandra's (host, port), its port also set as
    ``KASPER_CASSANDRA_PORT`` for the session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KASPER_CASSANDRA_PORT", str(cassandra_container.port))
        yield cassandra_container.contact


@pytest.fixture(scope="session")
def container_postgres_url(postgres_container: PostgresContainer) -> Iterator[str]:
    """The container PostgreSQL's URL, also set as ``KASPER_POSTGRES_URL``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KASPER_POSTGRES_URL", postgres_container.url)
        yield postgres_container.url


@pytest.fixture(scope="session")
def container_opensearch_url(opensearch_container: OpenSearchContainer) -> Iterator[str]:
    """The container OpenSearch's URL, also set as ``KASPER_OPENSEARCH_URL``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KASPER_OPENSEARCH_URL", opensearch_container.url)
        yield opensearch_container.url


def outside_ephemeral_range(port: int) -> bool:
    """Whether ``port`` is one ``free_ports`` hands out: at 20000 or above, below the
    kernel's ephemeral range (no outgoing connection takes it after the probe)."""
    return 20000 <= port < ephemeral_range()[0]
