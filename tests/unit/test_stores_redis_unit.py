"""The Redis store without a server: key formats, buffered reads, and what happens
when Redis cannot be reached (bounded retries, then StoreUnavailableError)."""

from __future__ import annotations

import importlib
import sys

import pytest

from kasper_py import Config, StoreUnavailableError
from kasper_py._support.ports import free_ports as closed_port
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.redis import RedisStore, RedisTable


def open_store(table: RedisTable, partition: int = 2) -> RedisStore:
    config = Config(name="wc", bootstrap_servers="unused:0", input_topics=["lines"])
    return table.open(StoreRuntime(config, partition))


def test_key_formats() -> None:
    """Keys are ``<prefix>/<table>/<partition>/<key>``, or without the partition when shared."""
    table = RedisTable("counts", url=f"redis://127.0.0.1:{closed_port()}/0")
    assert open_store(table).key("apple") == b"wc/counts/2/apple"
    assert open_store(table).offsets_key == "wc/counts#offsets/2"
    shared = RedisTable("users", shared=True, prefix="app", url=table.url)
    assert open_store(shared).key("u1") == b"app/users/u1"
    table.close()
    shared.close()


def test_buffered_writes_are_read_back_without_a_round_trip() -> None:
    """get_many answers buffered puts and deletes itself; only other keys go to Redis."""
    table = RedisTable("counts", url=f"redis://127.0.0.1:{closed_port()}/0")
    store = open_store(table)
    store.put_many({"a": 1, "b": {"n": 2}})
    store.delete("c")
    assert store.get_many(["a", "b", "c"]) == {"a": 1, "b": {"n": 2}}
    assert store.round_trips == 0
    table.close()


def test_unreachable_server_retries_then_raises_store_unavailable() -> None:
    """A refused connection is retried ``retries`` times with backoff, then surfaces as
    StoreUnavailableError naming the server, the command, the table and the partition."""
    port = closed_port()
    table = RedisTable("counts", url=f"redis://user:secret@127.0.0.1:{port}/0",
                       retries=2, backoff=0.01)
    store = open_store(table)
    store.put("a", 1)
    with pytest.raises(StoreUnavailableError) as info:
        store.flush({("lines", 2): 10})
    text = str(info.value)
    assert f"redis://127.0.0.1:{port}/0 unreachable" in text
    assert "MULTI/EXEC" in text and "'counts' partition 2" in text and "3 times" in text
    assert "secret" not in text
    assert store.round_trips == 3
    table.close()


def test_effectively_once_open_needs_the_server() -> None:
    """An effectively-once store reads its applied offsets when opened, so an absent
    server fails the open (before any processing) rather than the first turn."""
    table = RedisTable("counts", url=f"redis://127.0.0.1:{closed_port()}/0",
                       effectively_once=True, retries=0)
    with pytest.raises(StoreUnavailableError, match="HGETALL"):
        open_store(table)
    table.close()


def test_table_name_is_a_key_segment() -> None:
    """A '/' in a table name would make keys ambiguous."""
    with pytest.raises(ValueError, match="no '/'"):
        RedisTable("a/b")


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-py, importing the backend says which extra to install."""
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.delitem(sys.modules, "kasper_py.stores.redis")
    with pytest.raises(ImportError, match=r"pip install kasper-py\[redis\]"):
        importlib.import_module("kasper_py.stores.redis")
