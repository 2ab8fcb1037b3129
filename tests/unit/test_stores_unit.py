"""What every store shares, without a server: one write buffer (no backend rewrites
it), keys encoded a batch at a time as one at a time, discard_pending in each backend,
the store observer a store is handed, and the typed ``ProcessorContext.store``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kasper_py import JSON, Config, ProcessorContext, Serde, StoreError
from kasper_py._support.ports import free_ports as closed_port
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import (
    NOOP_STORE_OBSERVER,
    NoopObserver,
    StoreObservers,
    with_store_observer,
)
from kasper_py.stores.base import BufferedStore, KeyValueStore, StoreRuntime, Writes
from kasper_py.stores.cassandra import CassandraStore
from kasper_py.stores.memory import MemoryStore, MemoryTable
from kasper_py.stores.redis import RedisStore, RedisTable
from kasper_py.stores.rocksdb import RocksDBStore, RocksDBTable

BUFFER_METHODS = ("get_many", "put_many", "delete_many", "flush", "discard_pending")


class Recorder:
    """A StoreObserver that keeps every report."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, str, int]] = []
        self.restores: list[tuple[str, int, int, int]] = []
        self.started: list[tuple[str, int, int]] = []
        self.done: list[tuple[str, int, int, bool]] = []
        self.lags: list[tuple[str, int, int]] = []

    def on_store_op(self, store: str, op: str, seconds: float, round_trips: int) -> None:
        self.ops.append((store, op, round_trips))

    def on_restore_started(self, store: str, partition: int, records: int) -> None:
        self.started.append((store, partition, records))

    def on_restore_progress(self, store: str, partition: int, restored: int,
                            total: int) -> None:
        self.restores.append((store, partition, restored, total))

    def on_restore_done(self, store: str, partition: int, records: int, seconds: float,
                        from_standby: bool) -> None:
        self.done.append((store, partition, records, from_standby))

    def on_standby_lag(self, store: str, partition: int, offset: int, records: int,
                       seconds: float) -> None:
        self.lags.append((store, partition, records))


def config(tmp_path: Path) -> Config:
    return Config(name="wc", bootstrap_servers="unused:0", input_topics=["lines"],
                  state_dir=str(tmp_path))



@pytest.mark.parametrize("backend", [RedisStore, CassandraStore, RocksDBStore])
def test_backends_only_read_and_write(backend: type[BufferedStore]) -> None:
    """Redis, Cassandra and RocksDB keep the shared buffer as it is: they implement
    ``_read_many`` and ``_write``, never the buffered reads and writes themselves."""
    for method in BUFFER_METHODS:
        assert getattr(backend, method) is getattr(BufferedStore, method), method


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[[str], KeyValueStore]]:
    """Opens partition 0 of a memory, local RocksDB or (unreachable) Redis table."""
    tables: list[RedisTable] = []
    stores: list[KeyValueStore] = []

    def open_(kind: str) -> KeyValueStore:
        runtime = StoreRuntime(config(tmp_path), 0)
        if kind == "redis":
            tables.append(RedisTable("t", url=f"redis://127.0.0.1:{closed_port()}/0",
                                     retries=0))
            stores.append(tables[-1].open(runtime))
        else:
            table = MemoryTable("t") if kind == "memory" else RocksDBTable("t", changelog=False)
            stores.append(table.open(runtime))
        return stores[-1]

    yield open_
    for store in stores:
        store.close()
    for table in tables:
        table.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb", "redis"])
def test_discard_pending_drops_buffered_writes(
        kind: str, open_store: Callable[[str], KeyValueStore]) -> None:
    """After discard_pending, reads no longer see the buffered puts and deletes, and
    flush has nothing to write (Redis, unreachable here, is not even asked)."""
    store = open_store(kind)
    store.put_many({"a": 1, "b": 2})
    store.delete("c")
    store.discard_pending()
    store.flush({("lines", 0): 5})
    assert store.round_trips == 0
    if kind != "redis":
        assert store.get_many(["a", "b", "c"]) == {}


def test_a_store_reports_to_the_observer_it_was_handed(tmp_path: Path) -> None:
    """Reads that reach the backend and flushes with writes are reported with their
    round trips; reads answered by the buffer are not."""
    recorder = Recorder()
    table = RocksDBTable("t", changelog=False)
    store = table.open(StoreRuntime(config(tmp_path), 0, None, recorder))
    store.put("a", 1)
    assert store.get_many(["a"]) == {"a": 1}
    store.flush({})
    assert store.get_many(["a", "b"]) == {"a": 1}
    store.flush({})
    assert recorder.ops == [("t", "flush", 1), ("t", "get_many", 1)]
    store.close()


def test_with_store_observer_fans_store_reports_out() -> None:
    """The CLI's restore display listens beside the loop's own store observer."""
    inner, extra = Recorder(), Recorder()

    class Loop(NoopObserver):
        def store_observer(self) -> Recorder:
            return inner

    observer = with_store_observer(Loop(), extra)
    observer.on_idle()
    stores = observer.store_observer()
    assert isinstance(stores, StoreObservers)
    stores.on_restore_started("t", 1, 10)
    stores.on_restore_progress("t", 1, 5, 10)
    stores.on_store_op("t", "get_many", 0.1, 2)
    assert inner.started == extra.started == [("t", 1, 10)]
    assert inner.restores == extra.restores == [("t", 1, 5, 10)]
    assert inner.ops == extra.ops == [("t", "get_many", 2)]


def test_context_store_is_typed_and_checked(tmp_path: Path) -> None:
    """store(name) is a KeyValueStore; store(name, kind) narrows it, refusing another
    class; an unknown name lists the declared stores."""
    memory = MemoryStore()
    context = ProcessorContext(0, config(tmp_path), {"counts": memory})
    assert context.store("counts") is memory
    assert context.store("counts", MemoryStore) is memory
    with pytest.raises(TypeError, match="'counts' is a MemoryStore, not a RocksDBStore"):
        context.store("counts", RocksDBStore)
    with pytest.raises(KeyError, match=r"no store 'totals' \(declared: 'counts'\): "):
        context.store("totals")


class DictBackend(BufferedStore):
    """A BufferedStore over a dict: the shared buffer's keys and values, as written."""

    def __init__(self, key_serde: Serde, value_serde: Serde = JSON, prefix: bytes = b"") -> None:
        super().__init__("t", key_serde, value_serde, NOOP_STORE_OBSERVER, key_prefix=prefix)
        self.written: dict[bytes, bytes] = {}
        self.reads: list[list[bytes]] = []

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        self.reads.append(keys)
        return {k: self.written[k] for k in keys if k in self.written}

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        for key, value in writes.items():
            if value is None:
                self.written.pop(key, None)
            else:
                self.written[key] = value


class BytearraySerde:
    """A custom serde whose bytes come as a bytearray (bytes-like, not bytes)."""

    name = "bytearray"

    def encode(self, value: Any) -> bytearray | None:
        return None if value is None else bytearray(str(value).encode())

    def decode(self, data: bytes | None) -> Any:
        return None if data is None else data.decode()


KEYS: list[Any] = ["word", "ünï", 'q"\\', 7, -1, True, 2.5, ("t", 1), ""]


@pytest.mark.parametrize("prefix", [b"", b"wc/counts/"])
def test_a_batch_of_keys_encodes_as_each_key_does(prefix: bytes) -> None:
    """``encoded_keys`` (one pass, the serde called straight) gives each key's ``key()``:
    json.dumps's bytes for JSON keys, the prefix in front; a bytes-like serde output is
    made bytes; a None key is a StoreError, as it is alone."""
    store = DictBackend(JSON, prefix=prefix)
    assert store.encoded_keys(KEYS) == [store.key(k) for k in KEYS] == [
        prefix + json.dumps(k, separators=(",", ":")).encode() for k in KEYS]
    odd = DictBackend(BytearraySerde(), prefix=prefix)  # type: ignore[arg-type]
    assert odd.encoded_keys(["a", 1]) == [prefix + b"a", prefix + b"1"]
    assert all(type(k) is bytes for k in odd.encoded_keys(["a"]))
    with pytest.raises(StoreError, match="a store key cannot be None"):
        store.encoded_keys(["a", None])
    with pytest.raises(StoreError, match="a store key cannot be None"):
        store.put_many({"a": 1, None: 2})


def test_buffered_reads_and_writes_keep_their_meaning() -> None:
    """put_many, delete_many and get_many through the batch path: pending writes win,
    deletes hide, the rest is read in one request (keys as the serde writes them)."""
    store = DictBackend(JSON)
    store.put_many({"a": 1, "b": {"x": [1]}, 3: "three"})
    store.flush({})
    store.put_many({"a": 2})
    store.delete_many(iter(["b"]))
    found = store.get_many(k for k in ["a", "b", 3, "absent"])
    assert found == {"a": 2, 3: "three"}
    assert store.reads == [[b"3", b'"absent"']]
    store.flush({})
    assert store.written == {b'"a"': b"2", b"3": b'"three"'}
    assert store.get_many(["a", "a"]) == {"a": 2}
