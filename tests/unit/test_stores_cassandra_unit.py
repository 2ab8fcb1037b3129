"""The Cassandra store without a server: settings are validated up front, and an
unreachable cluster surfaces as StoreUnavailableError after bounded retries."""

from __future__ import annotations

import importlib
import sys

import pytest

from kasper_py import Config, StoreUnavailableError
from kasper_py._support.ports import free_ports as closed_port
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.cassandra import CassandraTable


def test_settings_are_validated_when_declared() -> None:
    """Bad identifiers and consistency levels fail at declaration, naming the field."""
    with pytest.raises(ValueError, match="keyspace 'my-ks' is not a CQL identifier"):
        CassandraTable("counts", keyspace="my-ks")
    with pytest.raises(ValueError, match="table '1x'"):
        CassandraTable("1x")
    with pytest.raises(ValueError, match="consistency 'MOST'"):
        CassandraTable("counts", consistency="MOST")
    table = CassandraTable("Counts", consistency="quorum")
    assert table.table == "counts"


def test_unreachable_cluster_raises_store_unavailable() -> None:
    """Opening against a closed port retries, then names the contact point and table."""
    port = closed_port()
    table = CassandraTable("counts", port=port, retries=1, backoff=0.01, timeout=2.0)
    config = Config(name="wc", bootstrap_servers="unused:0", input_topics=["lines"])
    with pytest.raises(StoreUnavailableError) as info:
        table.open(StoreRuntime(config, 0))
    text = str(info.value)
    assert f"cassandra 127.0.0.1:{port} unreachable" in text
    assert "kasper.counts" in text and "2 times" in text
    table.close()


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cassandra-driver, importing the backend says which extra to install."""
    monkeypatch.setitem(sys.modules, "cassandra", None)
    monkeypatch.delitem(sys.modules, "kasper_py.stores.cassandra", raising=False)
    with pytest.raises(ImportError, match=r"pip install kasper-py\[cassandra\]"):
        importlib.import_module("kasper_py.stores.cassandra")
