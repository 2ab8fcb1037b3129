"""Local RocksDB tables with no broker: buffered writes, changelog records, the restore
plan, iteration, and the errors a user can meet."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, StoreError
from kasper_py.kafka.topics import changelog_topic
from kasper_py.message import OutgoingMessage, OutgoingRecord
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.changelog import restore_plan
from kasper_py.stores.rocksdb import LocalDB, RocksDBStore, RocksDBTable
from kasper_py.testing import ProcessorDriver, make_message


class WordCount(MessageProcessor):
    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        batch = Counter(word for m in messages for word in m.value.split())
        totals = self.counts.get_many(batch)
        for word, count in batch.items():
            totals[word] = totals.get(word, 0) + count
        self.counts.put_many(totals)


class FakeProducer:
    """Records what a store produces, like OutputProducer.produce."""

    def __init__(self) -> None:
        self.messages: list[OutgoingMessage] = []

    def produce(self, messages: list[OutgoingRecord]) -> None:
        self.messages.extend(map(OutgoingMessage.of, messages))


def config(tmp_path: Path, name: str = "wc") -> Config:
    return Config(name=name, bootstrap_servers="unused:0", input_topics=["lines"],
                  state_dir=str(tmp_path), value_serde="str")


def store_with_changelog(tmp_path: Path, producer: FakeProducer,
                         offset: int = 0) -> RocksDBStore:
    cfg = config(tmp_path)
    table = RocksDBTable("counts")
    db = LocalDB(table.path(cfg, 0))
    return RocksDBStore(table, db, StoreRuntime(cfg, 0, producer), changelog_offset=offset)


def test_local_only_word_count_is_exact_and_survives_reopen(tmp_path: Path) -> None:
    """With changelog=False a table still counts exactly and keeps its state on disk."""
    def driver() -> ProcessorDriver:
        return ProcessorDriver(WordCount, config=config(tmp_path),
                               stores=[RocksDBTable("counts", changelog=False)])

    first = driver()
    first.process([make_message("lines", "a b a"), make_message("lines", "c", partition=1)])
    first.process([make_message("lines", "a")])
    assert first.store("counts").get_many(["a", "b", "zz"]) == {"a": 3, "b": 1}
    first.store("counts").close()
    first.store("counts", 1).close()
    again = driver()
    assert dict(again.store("counts").items()) == {"a": 3, "b": 1}
    assert dict(again.store("counts", 1).items()) == {"c": 1}
    assert (tmp_path / "wc" / "counts" / "0").is_dir()


def test_changelog_table_needs_the_loops_producer(tmp_path: Path) -> None:
    """Opened with no runner's producer (neither a TopicProcessor nor a ProcessorDriver,
    which keeps the changelog in memory), a changelog-backed table says how to run it."""
    with pytest.raises(StoreError, match=r"run it in a TopicProcessor \(or a "
                                         r"ProcessorDriver\), or pass changelog=False"):
        RocksDBTable("counts").open(StoreRuntime(config(tmp_path), 0))


def test_flush_produces_changelog_then_applies_after_delivery(tmp_path: Path) -> None:
    """flush() only produces (deletes as tombstones); after_delivery() applies locally
    and moves the recorded changelog offset past the records."""
    producer = FakeProducer()
    store = store_with_changelog(tmp_path, producer, offset=7)
    store.put_many({"a": 1, "b": 2})
    store.delete("gone")
    assert store.get_many(["a", "gone"]) == {"a": 1}
    store.flush({("lines", 0): 10})
    assert producer.messages == [
        OutgoingMessage("wc-counts-changelog", b"1", b"a", 0),
        OutgoingMessage("wc-counts-changelog", b"2", b"b", 0),
        OutgoingMessage("wc-counts-changelog", None, b"gone", 0),
    ]
    assert store.db.get_many([b"a"]) == [None]  # not applied before the acks
    store.after_delivery()
    assert store.db.get_many([b"a", b"b"]) == [b"1", b"2"]
    assert store.db.changelog_offset(0) == 10 == store.changelog_offset
    store.after_delivery()  # a second call (outputs-first turns) changes nothing
    assert store.db.changelog_offset(0) == 10
    store.close()


def test_items_overlay_buffered_writes(tmp_path: Path) -> None:
    """items() shows applied rows with buffered puts and deletes laid over them."""
    store = store_with_changelog(tmp_path, FakeProducer())
    store.put_many({"a": 1, "b": 2, "c": 3})
    store.flush({})
    store.after_delivery()
    store.put_many({"b": 20, "d": 4})
    store.delete("c")
    assert dict(store.items()) == {"a": 1, "b": 20, "d": 4}
    assert store.round_trips == 1  # one WriteBatch; items() iterates, it does not multi-get
    store.close()


def test_a_batch_costs_one_multiget_and_one_write_batch(tmp_path: Path) -> None:
    """However many keys a batch touches, it reads once and writes once."""
    store = store_with_changelog(tmp_path, FakeProducer())
    words = [f"w{i}" for i in range(500)]
    counts = store.get_many(words)
    store.put_many({w: counts.get(w, 0) + 1 for w in words})
    store.flush({})
    store.after_delivery()
    assert store.round_trips == 2
    store.close()


def test_none_key_is_refused(tmp_path: Path) -> None:
    """A key the serde encodes to None cannot be stored."""
    store = store_with_changelog(tmp_path, FakeProducer())
    with pytest.raises(StoreError, match="cannot be None"):
        store.put(None, 1)
    store.close()


def test_second_open_of_a_partition_is_a_clear_store_error(tmp_path: Path) -> None:
    """RocksDB's LOCK keeps two openers off one partition; the error names the folder."""
    first = LocalDB(tmp_path / "db")
    with pytest.raises(StoreError, match="another process"):
        LocalDB(tmp_path / "db")
    first.close()
    LocalDB(tmp_path / "db").close()  # released on close


def test_reset_wipes_data_and_records_the_topic(tmp_path: Path) -> None:
    """reset() leaves an empty database that remembers its changelog topic."""
    db = LocalDB(tmp_path / "db")
    db.write({b"k": b"v"}, {0: 5})
    db.reset("t-changelog")
    assert list(db.items()) == []
    assert db.changelog_offset(0) is None
    assert db.topic() == "t-changelog"
    db.close()


@pytest.mark.parametrize(("recorded", "low", "high", "plan"), [
    (None, 0, 50, (0, True, "missing")),
    (None, 10, 10, (10, True, "missing")),
    (20, 0, 50, (20, False, "behind")),
    (50, 0, 50, (50, False, "up to date")),
    (60, 0, 50, (0, True, "ahead of changelog")),
    (5, 10, 50, (10, True, "older than changelog start")),
])
def test_restore_plan(recorded: int | None, low: int, high: int,
                      plan: tuple[int, bool, str]) -> None:
    """Local files resume where they stopped, or are rebuilt when they cannot be trusted."""
    assert restore_plan(recorded, low, high) == plan


def test_names_and_paths(tmp_path: Path) -> None:
    """Changelog ``<processor>-<table>-changelog``, folder ``<state_dir>/<processor>/<table>/<p>``;
    table names are path segments."""
    table = RocksDBTable("counts")
    assert changelog_topic("wc", "counts") == "wc-counts-changelog"
    assert table.topic(config(tmp_path)) == "wc-counts-changelog"
    assert RocksDBTable("t", changelog_topic="other").topic(config(tmp_path)) == "other"
    assert table.path(config(tmp_path), 3) == tmp_path / "wc" / "counts" / "3"
    with pytest.raises(ValueError, match="no '/'"):
        RocksDBTable("a/b")
    with pytest.raises(ValueError, match="changelog=True"):
        RocksDBTable("g", global_table=True, changelog=False)


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without rocksdict, importing the backend says which extra to install."""
    monkeypatch.setitem(sys.modules, "rocksdict", None)
    monkeypatch.delitem(sys.modules, "kasper_py.stores.rocksdb")
    with pytest.raises(ImportError, match=r"pip install kasper-py\[rocksdb\]"):
        importlib.import_module("kasper_py.stores.rocksdb")
