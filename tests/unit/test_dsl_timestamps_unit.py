"""Output timestamps of the DSL's tables with ``Builder(timestamps="latest")``, as Kafka
Streams gives them: an aggregation's
update carries the largest timestamp folded into its aggregate, a table-table join's
the larger of its two sides'; the times are kept in ``<store>-timestamps`` beside the
values, so a store written before they were kept still restores and reads, its values
as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kasper_py import Config
from kasper_py.dsl import Builder
from kasper_py.exceptions import ConfigError
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs

Out = tuple[Any, Any, int | None]


def outputs(driver: ProcessorDriver, topic: str) -> list[Out]:
    """What the app sent to ``topic``, decoded: (key, value, timestamp)."""
    return [(json.loads(m.key or b"null"), None if m.value is None else json.loads(m.value),
             m.timestamp) for m in driver.sent if m.topic == topic]


def counts(stores: str = "memory", cache: bool = False) -> Builder:
    b = Builder("stamps", stores=stores, cache=cache, timestamps="latest")
    b.stream("in").group_by_key().count("counts").to_stream().to("out")
    return b


def test_an_aggregate_keeps_the_largest_time_and_forgets_it_when_deleted() -> None:
    """A late record (earlier timestamp) updates the aggregate stamped with the latest
    time folded in so far, in the same batch and in a later one; an aggregate reset to
    ``None`` is a delete stamped the same way, and the key's next record starts again
    from its own time. The store holds the bare aggregate, its time beside it."""
    b = Builder("resets", stores="memory", cache=False, timestamps="latest")
    (b.stream("in").group_by_key()
        .reduce(lambda total, v: None if v == 0 else total + v, "sums")
        .to_stream().to("out"))
    driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
    driver.process([make_message("in", 2, "a", timestamp=50),
                    make_message("in", 3, "a", timestamp=20)])
    driver.process([make_message("in", 1, "a", timestamp=30),
                    make_message("in", 0, "a", timestamp=10),
                    make_message("in", 4, "a", timestamp=5)])
    assert outputs(driver, "out") == [("a", 2, 50), ("a", 5, 50), ("a", 6, 50),
                                      ("a", None, 50), ("a", 4, 5)]
    assert driver.store("sums").get_many(["a"]) == {"a": 4}
    assert driver.store("sums-timestamps").get_many(["a"]) == {"a": 5}


def test_a_count_with_the_cache_emits_each_key_once_with_its_largest_time() -> None:
    """The cached count (the word count's path): one update per key and batch,
    stamped with the largest time of the key's records so far, not its last record's."""
    driver = ProcessorDriver(counts(cache=True).build(), key_serde="json",
                             value_serde="json")
    driver.process([make_message("in", "x", k, timestamp=t)
                    for k, t in (("a", 40), ("b", 7), ("a", 10))])
    driver.process([make_message("in", "x", "a", timestamp=20)])
    assert outputs(driver, "out") == [("b", 1, 7), ("a", 2, 40), ("a", 3, 40)]


def test_a_table_join_is_stamped_with_the_later_side() -> None:
    """A table-table join's result carries the larger of the two sides' times, also
    when the update that makes it is the earlier one (the other side came first, in
    an earlier batch), for inner, left and outer joins; a left join's result without
    a right value carries the left's time."""
    for how in ("join", "left_join", "outer_join"):
        b = Builder("tables", stores="memory", cache=False, timestamps="latest")
        left, right = b.table("l"), b.table("r")
        getattr(left, how)(right, lambda v, w: [v, w]).to_stream().to("out")
        driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
        driver.process([make_message("r", 1, "a", timestamp=100),
                        make_message("l", 1, "b", timestamp=60)])
        driver.process([make_message("l", 2, "a", timestamp=40)])
        driver.process([make_message("r", 3, "a", timestamp=70)])
        got = outputs(driver, "out")
        assert got[-2:] == [("a", [2, 1], 100), ("a", [2, 3], 70)], how
        if how != "join":
            assert ("b", [1, None], 60) in got, how


def test_a_join_of_two_aggregations_takes_their_largest_times() -> None:
    """The sides of a table-table join may be aggregations: each side's time is the
    largest folded into its aggregate."""
    b = Builder("aggregated", stores="memory", cache=False, timestamps="latest")
    left = b.stream("l").group_by_key().count("left")
    right = b.stream("r").group_by_key().count("right")
    left.join(right, lambda v, w: [v, w]).to_stream().to("out")
    driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
    driver.process([make_message("l", "x", "a", timestamp=90)])
    driver.process([make_message("l", "x", "a", timestamp=10)])
    driver.process([make_message("r", "x", "a", timestamp=30)])
    assert outputs(driver, "out") == [("a", [2, 1], 90)]


def test_a_store_written_before_times_were_kept_restores_and_reads(tmp_path: Path) -> None:
    """The upgrade: a count's changelog written by a version that kept no times (the
    bare value, no ``counts-timestamps`` topic) restores on a fresh disk; the count
    goes on from it, its first update stamped with the record's own time (the old
    value's time is unknown, older than any), and the store, its query path and its
    changelog keep bare values."""
    config = Config(name="stamps", bootstrap_servers="in-memory:0", input_topics=["in"],
                    key_serde="json", value_serde="json", state_dir=str(tmp_path))
    changelogs = MemoryChangelogs()
    topic = RocksDBTable("counts").topic(config)
    changelogs.append(topic, 0, b'"a"', b"5", timestamp=1)
    driver = ProcessorDriver(counts("rocksdb").build(), config=config, changelogs=changelogs)
    driver.process([make_message("in", "x", "a", timestamp=30)])
    driver.process([make_message("in", "x", "a", timestamp=20)])
    assert outputs(driver, "out") == [("a", 6, 30), ("a", 7, 30)]
    assert driver.store("counts").get_many(["a"]) == {"a": 7}
    assert driver.store("counts").query_get_many(["a"]) == {"a": 7}
    assert changelogs.records(topic)[-1] == (b'"a"', b"7")
    driver.close()


def test_a_foreign_key_joins_result_counts_with_the_time_it_was_emitted() -> None:
    """A foreign-key join's result joined with another table: its side's time is the
    one the result was emitted with (the order's), later than the note's."""
    b = Builder("fk-stamps", stores="memory", cache=False, timestamps="latest")
    orders, customers, notes = b.table("orders"), b.table("customers"), b.table("notes")
    named = orders.join_foreign(customers, lambda o: o["c"], lambda o, c: c["name"],
                                name="named")
    named.join(notes, lambda name, note: [name, note]).to_stream().to("out")
    driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
    driver.process([make_message("customers", {"name": "Ann"}, "c1", timestamp=5),
                    make_message("orders", {"c": "c1"}, "o1", timestamp=80)])
    driver.process([make_message("notes", "late", "o1", timestamp=20)])
    assert outputs(driver, "out") == [("o1", ["Ann", "late"], 80)]


def joined_counts(timestamps: str, asked: list[str]) -> Builder:
    """A count joined with a table, its stores made by a ``stores=`` function that
    notes the names it is asked for in ``asked``."""
    def stores(name: str, _windowed: bool) -> StoreSpec:
        asked.append(name)
        return MemoryTable(name)

    b = Builder("modes", stores=stores, cache=False, timestamps=timestamps)  # type: ignore[arg-type]
    counted = b.stream("in").group_by_key().count("counts")
    counted.join(b.table("users"), lambda n, user: [n, user]).to_stream().to("out")
    return b


@pytest.mark.parametrize(("timestamps", "names"), [
    ("record", ["counts", "users"]),
    ("latest", ["counts", "counts-timestamps", "users", "users-timestamps"])])
def test_only_the_latest_mode_keeps_times_in_stores_of_their_own(
        timestamps: str, names: list[str]) -> None:
    """The default (``"record"``) asks a ``stores=`` function for the tables' stores
    only, and the app holds no other; ``"latest"`` asks for, and holds, a
    ``<store>-timestamps`` beside each table it keeps times of."""
    asked: list[str] = []
    app = joined_counts(timestamps, asked).build()
    assert sorted(asked) == names
    assert sorted(spec.name for node in app.nodes for spec in node.stores) == names


def test_the_default_stamps_each_update_with_its_records_time() -> None:
    """With the default, a late record's count and the join it updates carry the late
    record's own time, as before times were kept."""
    driver = ProcessorDriver(joined_counts("record", []).build(), key_serde="json",
                             value_serde="json")
    driver.process([make_message("users", "Ann", "a", timestamp=90)])
    driver.process([make_message("in", "x", "a", timestamp=50),
                    make_message("in", "x", "a", timestamp=10)])
    assert outputs(driver, "out") == [("a", [1, "Ann"], 50), ("a", [2, "Ann"], 10)]


def test_an_unknown_timestamps_mode_is_refused_naming_it() -> None:
    """``timestamps=`` takes ``"record"`` or ``"latest"``; anything else is a
    ``ConfigError`` naming the value and the choices."""
    with pytest.raises(ConfigError, match="Builder\\(timestamps='newest'\\): timestamps is "
                                          "one of 'record', 'latest'"):
        Builder("bad", timestamps="newest")  # type: ignore[arg-type]
