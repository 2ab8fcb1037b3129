"""pytest fixtures over ``kasper_py.testing.containers``, loaded with
``pytest_plugins = ["kasper_py.testing.container_fixtures"]``.

``kafka_container``, ``redis_container``, ``schema_registry_container``,
``cassandra_container``, ``postgres_container`` and ``opensearch_container`` are
session-wide (one server per test run, started when a test first asks, removed at the
run's end); ``kafka_bootstrap`` and ``redis_container_url`` hand back their addresses
(the others' are ``.url``, and ``.contact`` for Cassandra). Where no container engine
answers, the tests using them are skipped, and the reason names what to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from kasper_py.testing.containers import (
    CassandraContainer,
    ContainerEngineError,
    KafkaContainer,
    OpenSearchContainer,
    PostgresContainer,
    RedisContainer,
    SchemaRegistryContainer,
    ServerContainer,
)

Server = TypeVar("Server", bound=ServerContainer)


def _started(server: Server) -> Iterator[Server]:
    try:
        server.start()
    except ContainerEngineError as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_container() -> Iterator[KafkaContainer]:
    """A Kafka broker (KRaft) in a container for the whole test session."""
    yield from _started(KafkaContainer())


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_container: KafkaContainer) -> str:
    """The container broker's bootstrap address, ``127.0.0.1:<port>``."""
    return kafka_container.bootstrap_servers


@pytest.fixture(scope="session")
def redis_container() -> Iterator[RedisContainer]:
    """A Redis server in a container for the whole test session."""
    yield from _started(RedisContainer())


@pytest.fixture(scope="session")
def redis_container_url(redis_container: RedisContainer) -> str:
    """The container Redis's URL, ``redis://127.0.0.1:<port>/0``."""
    return redis_container.url


@pytest.fixture(scope="session")
def schema_registry_container() -> Iterator[SchemaRegistryContainer]:
    """A schema registry (Apicurio, Confluent-compatible) in a container for the session."""
    yield from _started(SchemaRegistryContainer())


@pytest.fixture(scope="session")
def cassandra_container() -> Iterator[CassandraContainer]:
    """One Cassandra node in a container for the session (``.contact``: host, port)."""
    yield from _started(CassandraContainer())


@pytest.fixture(scope="session")
def postgres_container() -> Iterator[PostgresContainer]:
    """A PostgreSQL server in a container for the session (``.url``)."""
    yield from _started(PostgresContainer())


@pytest.fixture(scope="session")
def opensearch_container() -> Iterator[OpenSearchContainer]:
    """One OpenSearch node in a container for the session (``.url``)."""
    yield from _started(OpenSearchContainer())
