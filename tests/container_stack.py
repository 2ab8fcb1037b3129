"""The integration suite against servers in containers: with ``KASPER_STACK=containers``
the ``bootstrap`` and ``redis_url`` fixtures hand out a Kafka and a Redis started in
containers (kasper_py.testing.containers) once per session, instead of the local stack's
processes; the same tests run. Loaded as a plugin by tests/conftest.py, beside
kasper_py.testing.container_fixtures, whose fixtures these build on.

Where no container engine answers, those tests skip with what to install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kasper_py.testing.containers import KafkaContainer, RedisContainer


def on_containers() -> bool:
    """True when this run's servers are containers (``KASPER_STACK=containers``)."""
    return os.environ.get("KASPER_STACK", "").strip().lower() == "containers"


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
