"""Every component of the local stack by name, the groups that stand for several, and
the one way to build a component from its name."""

from __future__ import annotations

from kasper_py.stack._components import (
    Cassandra,
    Component,
    Kafka,
    Redis,
    SparkMaster,
    SparkWorker1,
    SparkWorker2,
)
from kasper_py.stack._engine import Podman
from kasper_py.stack._jaeger import Jaeger
from kasper_py.stack._opensearch import OpenSearch
from kasper_py.stack._postgres import Postgres
from kasper_py.stack._prometheus import Prometheus
from kasper_py.stack._registry import SchemaRegistry
from kasper_py.stack._settings import Settings

COMPONENTS: dict[str, type[Component]] = {
    component.name: component for component in (
        Kafka, SchemaRegistry, Redis, Cassandra, Prometheus, SparkMaster, SparkWorker1,
        SparkWorker2, Jaeger, OpenSearch, Postgres, Podman)
}

GROUPS: dict[str, tuple[str, ...]] = {
    "spark": (SparkMaster.name, SparkWorker1.name, SparkWorker2.name),
}
"""Names that stand for several components, started in this order."""


def build(name: str, settings: Settings) -> Component:
    """The component called ``name`` (a key of ``COMPONENTS``) for ``settings``."""
    return COMPONENTS[name](settings)
