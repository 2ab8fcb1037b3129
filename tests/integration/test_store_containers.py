"""Cassandra, PostgreSQL and OpenSearch in containers (kasper_py.testing.containers) on
the real engine: each up, a kasper store's write read back through a store opened
afterwards, the container gone afterwards; a server failing at start is an error quoting
its log, and leaves no container."""

from __future__ import annotations

import socket
import urllib.request
import uuid
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.opensearch import OpenSearchTable
from kasper_py.stores.postgres import PostgresTable
from kasper_py.testing.containers import (
    CassandraContainer,
    ContainerStartError,
    OpenSearchContainer,
    PostgresContainer,
)
from tests.container_stack import exists, of_this_process, outside_ephemeral_range

pytestmark = pytest.mark.integration
CONFIG = Config(name="boxed", bootstrap_servers="127.0.0.1:1", input_topics=["t"])


def write_then_read(spec: StoreSpec, reread: StoreSpec) -> dict[str, Any]:
    """Put two keys and delete one in a turn of partition 0 through ``spec``; what a
    store opened afterwards from ``reread`` reads."""
    store = spec.open(StoreRuntime(CONFIG, 0))
    store.put_many({"alpha": {"n": 1}, "beta": {"n": 2}})
    store.flush({("t", 0): 3})
    store.delete("beta")
    store.flush({("t", 0): 4})
    spec.close()
    try:
        return dict(reread.open(StoreRuntime(CONFIG, 0)).get_many(["alpha", "beta"]))
    finally:
        reread.close()


def test_a_cassandra_table_round_trips_through_a_cassandra_container(engine: Any) -> None:
    """CassandraTable writes and reads on a node in a container; the node is its own
    cluster (not the stack's); the container is removed on leaving the block."""
    keyspace = f"boxed_{uuid.uuid4().hex[:10]}"
    with CassandraContainer() as cassandra:
        container_id = cassandra.container_id
        host, port = cassandra.contact
        assert host == "127.0.0.1" and outside_ephemeral_range(port)
        tables = [CassandraTable("counts", contact_points=[host], port=port, keyspace=keyspace)
                  for _ in range(2)]
        assert write_then_read(*tables) == {"alpha": {"n": 1}}
    assert not exists(engine, container_id)


def test_a_postgres_table_round_trips_through_a_postgres_container(engine: Any) -> None:
    """PostgresTable writes, reads and its applied offsets on a server in a container."""
    with PostgresContainer() as postgres:
        container_id = postgres.container_id
        assert postgres.url == f"postgresql://postgres@127.0.0.1:{postgres.port}/postgres"
        assert outside_ephemeral_range(postgres.port)
        tables = [PostgresTable("counts", url=postgres.url) for _ in range(2)]
        assert write_then_read(*tables) == {"alpha": {"n": 1}}
        store = tables[0].open(StoreRuntime(CONFIG, 0))
        assert store.applied_offsets() == {("t", 0): 4}
        tables[0].close()
    assert not exists(engine, container_id)


def test_an_opensearch_table_round_trips_through_an_opensearch_container(engine: Any) -> None:
    """OpenSearchTable writes and reads on a node in a container, which answers with the
    stack's OpenSearch version."""
    with OpenSearchContainer() as opensearch:
        container_id = opensearch.container_id
        with urllib.request.urlopen(opensearch.url, timeout=10) as reply:
            assert b'"number" : "2.19.' in reply.read()
        tables = [OpenSearchTable("counts", url=opensearch.url) for _ in range(2)]
        assert write_then_read(*tables) == {"alpha": {"n": 1}}
    assert not exists(engine, container_id)


def test_a_store_server_failing_at_start_is_an_error_quoting_its_log(engine: Any) -> None:
    """A PostgreSQL refusing its configuration: ContainerStartError carries the server's
    own complaint, and no container is left."""
    broken = PostgresContainer()
    broken.command = lambda: ["postgres", "-c", "no_such_setting=1"]  # type: ignore[method-assign]
    with pytest.raises(ContainerStartError) as error:
        broken.start()
    assert 'unrecognized configuration parameter "no_such_setting"' in str(error.value)
    assert str(error.value).startswith(broken.local_image)
    assert of_this_process(engine, "no_such_setting") == set()


def test_a_port_taken_before_the_server_binds_it_is_replaced(engine: Any) -> None:
    """Free ports are probed, then bound by the server seconds later; a client's outgoing
    connection may take one meanwhile (not one outside the ephemeral range, but another
    process's probe may draw the same port). The server
    then starts again on fresh ports, and answers there."""
    postgres = PostgresContainer()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", postgres.port))
        squatter.listen(1)
        taken = postgres.port
        with postgres:
            assert postgres.port != taken
            table = PostgresTable("counts", url=postgres.url)
            assert write_then_read(table, PostgresTable("counts", url=postgres.url)) == {
                "alpha": {"n": 1}}
            container_id = postgres.container_id
    assert not exists(engine, container_id)
