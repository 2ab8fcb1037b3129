"""A real local stack for kasper_py: Kafka, a schema registry, Redis, Cassandra,
Prometheus, OpenSearch, a Spark standalone cluster and a tracing backend (Jaeger) on
127.0.0.1.

``kasper stack up|down|status [components...]`` (or ``python -m kasper_py.stack``)
starts pinned servers as plain local processes, no Docker: Kafka and Cassandra from
Maven Central jars, the schema registry (Apicurio, Confluent-compatible) from a jar
built once from Maven Central, OpenSearch (``opensearch``, one node, security off)
from Maven Central jars, Redis and Prometheus from Debian packages, Spark's master and two
workers (``spark``: ``spark-master``, ``spark-worker-1``, ``spark-worker-2``) from the
pyspark wheel, Jaeger v2 (``jaeger``, OTLP in, a query API out) built once with ``go``
from the Go module proxy, PostgreSQL (``postgres``, Debian's server run on a cluster of
its own), and a container engine (``podman``: Podman and runc from Debian's packages,
the Docker API on a unix socket for ``kasper_py.testing.containers``; ``images`` builds
the images its containers run). Everything lives under ``$KASPER_STACK_DIR``, else the
``.kasper-stack`` found in the current folder or above it, else the one ``up`` last
recorded for this user, else ``./.kasper-stack``; so ``kasper stack status`` works from
any folder. Ports come from ``KASPER_*_PORT``, Redis's persistence from
``KASPER_REDIS_PERSISTENCE`` (``aof`` by default), what a Spark worker offers from
``KASPER_SPARK_WORKER_CORES`` (1) and ``KASPER_SPARK_WORKER_MEMORY`` (1g).
Tests and examples find the servers through the address helpers below.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack import _lifecycle
from kasper_py.stack._cli import main
from kasper_py.stack._components import SparkMaster, cql_answers, kafka_answers, redis_answers
from kasper_py.stack._engine import Podman
from kasper_py.stack._errors import StackError
from kasper_py.stack._images import (
    cassandra_version,
    image_name,
    kafka_version,
    opensearch_version,
    postgres_version,
    registry_version,
)
from kasper_py.stack._jaeger import Jaeger
from kasper_py.stack._lifecycle import ComponentStatus
from kasper_py.stack._opensearch import OpenSearch, opensearch_answers
from kasper_py.stack._postgres import Postgres
from kasper_py.stack._prometheus import scraped, targets_file, write_targets
from kasper_py.stack._registry import SchemaRegistry
from kasper_py.stack._settings import Settings
from kasper_py.stack._spark import spark_jars

__all__ = [
    "ComponentStatus",
    "StackError",
    "cassandra_contact",
    "cassandra_version",
    "cql_answers",
    "docker_host",
    "down",
    "image_name",
    "jaeger_otlp_endpoint",
    "jaeger_url",
    "kafka_answers",
    "kafka_bootstrap",
    "kafka_version",
    "main",
    "opensearch_answers",
    "opensearch_url",
    "opensearch_version",
    "postgres_url",
    "postgres_version",
    "prometheus_target",
    "prometheus_url",
    "redis_answers",
    "redis_url",
    "registry_version",
    "schema_registry_url",
    "set_prometheus_targets",
    "spark_jars",
    "spark_master_url",
    "status",
    "up",
]

StackDir = str | os.PathLike[str] | None


def up(components: Sequence[str] = (), stack_dir: StackDir = None) -> list[ComponentStatus]:
    """Start ``components`` (default kafka and redis; ``"all"`` for every one).

    Returns once each answers a real request; already running ones are left alone.
    Raises StackError naming the log file when a component fails to start.
    """
    return _lifecycle.up(components, Settings.load(stack_dir), report=_print)


def down(components: Sequence[str] = (), stack_dir: StackDir = None,
         purge: bool = False) -> None:
    """Stop the components this stack started (default all); ``purge`` deletes their data."""
    _lifecycle.down(components, Settings.load(stack_dir), purge, report=_print)


def status(stack_dir: StackDir = None) -> list[ComponentStatus]:
    """Running or stopped, pid and address of every component."""
    return _lifecycle.status(Settings.load(stack_dir))


def kafka_bootstrap() -> str:
    """``$KASPER_BOOTSTRAP_SERVERS`` if set (an existing cluster), else the local broker."""
    return os.environ.get("KASPER_BOOTSTRAP_SERVERS") or (
        f"{LOOPBACK}:{Settings.load().kafka_port}")


def redis_url() -> str:
    """``redis://127.0.0.1:<port>/0`` of the local Redis."""
    return f"redis://{LOOPBACK}:{Settings.load().redis_port}/0"


def schema_registry_url() -> str:
    """``$KASPER_SCHEMA_REGISTRY_URL`` if set (an existing registry), else the local
    registry's Confluent-compatible API, ``http://127.0.0.1:<port>/apis/ccompat/v7``."""
    return os.environ.get("KASPER_SCHEMA_REGISTRY_URL") or SchemaRegistry(Settings.load()).url


def cassandra_contact() -> tuple[str, int]:
    """(host, native port) of the local Cassandra, as cassandra-driver's Cluster wants them."""
    return LOOPBACK, Settings.load().cassandra_port


def prometheus_url() -> str:
    """Base URL of the local Prometheus (its HTTP API is under ``/api/v1``)."""
    return f"http://{LOOPBACK}:{Settings.load().prometheus_port}"


def opensearch_url() -> str:
    """``$KASPER_OPENSEARCH_URL`` if set (an existing cluster), else the local node's REST
    base URL, as ``OpenSearchTable(url=...)`` takes it."""
    return os.environ.get("KASPER_OPENSEARCH_URL") or OpenSearch(Settings.load()).url


def jaeger_url() -> str:
    """Base URL of the local Jaeger's query API (traces under ``/api/v3/traces``)."""
    return f"http://{Jaeger(Settings.load()).address}"


def jaeger_otlp_endpoint() -> str:
    """The local Jaeger's OTLP/HTTP receiver, as ``Config.otlp_endpoint`` takes it."""
    return Jaeger(Settings.load()).otlp_endpoint


def postgres_url() -> str:
    """``$KASPER_POSTGRES_URL`` if set (an existing server), else the local PostgreSQL's
    ``postgresql://postgres@127.0.0.1:<port>/postgres`` (trust authentication)."""
    return os.environ.get("KASPER_POSTGRES_URL") or Postgres(Settings.load()).url


def docker_host(stack_dir: StackDir = None) -> str | None:
    """Where the stack's container engine (``kasper stack up podman``) serves the Docker
    API, ``unix://<stack>/podman/podman.sock``; None when that socket does not exist."""
    engine = Podman(Settings.load(stack_dir))
    return engine.docker_host if engine.socket_path.exists() else None


def spark_master_url(stack_dir: StackDir = None) -> str:
    """``$KASPER_SPARK_MASTER`` if set (an existing cluster, e.g. ``spark://host:7077`` or
    ``yarn``), else the local master's ``spark://127.0.0.1:<port>``: what drivers pass
    as ``--master``."""
    return os.environ.get("KASPER_SPARK_MASTER") or SparkMaster(Settings.load(stack_dir)).address


def set_prometheus_targets(targets: Sequence[str], stack_dir: StackDir = None) -> None:
    """Make the local Prometheus scrape ``targets`` (``"host:port"``) within ~1 s, beside
    the running ``kasper run`` processes it finds by itself.

    Rewrites the ``file_sd_configs`` file Prometheus watches; the write goes through a
    rename so Prometheus never reads a half-written file.
    """
    write_targets(targets_file(Settings.load(stack_dir)), targets)


def prometheus_target(processor: str, address: tuple[str, int] | None,
                      stack_dir: StackDir = None) -> AbstractContextManager[Path | None]:
    """While the ``with`` block runs, the stack's Prometheus scrapes the metrics server
    at ``address`` (host, port), as ``kasper run`` has every processor do: a target file
    named after the process and ``processor`` in the stack's ``prometheus/targets/``,
    removed at the end. Yields that file; None when there is no address, or no stack
    Prometheus on this machine (found as ``status`` finds the stack)."""
    try:
        settings = Settings.load(stack_dir)
    except StackError:  # a bad KASPER_*_PORT concerns the stack, not this processor
        return nullcontext(None)
    return scraped(processor, address, settings)


def _print(line: str) -> None:
    print(line, flush=True)
