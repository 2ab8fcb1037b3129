"""``ttl=`` on the DSL's tables and aggregations: a key not updated for ``ttl`` seconds
is removed, so its count starts again; the builder's own stores take it, a ``stores=``
function must give it itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kasper_py.dsl import Builder
from kasper_py.exceptions import ConfigError
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message


def _counts(driver: ProcessorDriver) -> list[tuple[Any, Any]]:
    return [(json.loads(m.key), json.loads(m.value)) for m in driver.sent if m.topic == "out"]


def test_a_count_with_a_ttl_forgets_a_key_not_counted_for_that_long() -> None:
    """"a" twice, then 61 s of wall clock with only "b": "a" is removed, so its next
    record counts 1 again; "b", counted 30 s before, keeps its count."""
    b = Builder("ttl-count", stores="memory", cache=False)
    b.stream("in").group_by_key().count("counts", ttl=60).to_stream().to("out")
    driver = ProcessorDriver(b.build(), key_serde="json", value_serde="json")
    driver.process([make_message("in", 1, "a"), make_message("in", 1, "a")])
    driver.advance_wall_clock(31)
    driver.process([make_message("in", 1, "b")])
    driver.advance_wall_clock(30)
    driver.process([make_message("in", 1, "b")])  # its turn removes "a" (61 s old)
    driver.process([make_message("in", 1, "a"), make_message("in", 1, "b")])
    assert _counts(driver) == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("a", 1), ("b", 3)]
    assert driver.store("counts").get("a") == 1


def test_a_source_table_takes_a_ttl_and_the_builder_passes_it_to_rocksdb() -> None:
    """Builder.table(ttl=) and every aggregation give their RocksDB table that ttl; an
    aggregation without one keeps its keys."""
    assert ttl_specs(Builder("ttl-specs")) == {"users": 3600, "last": 120, "total": None}


def test_an_aggregations_kept_times_take_its_ttl() -> None:
    """With ``timestamps="latest"``, an aggregation's kept times are removed with its
    keys: their store takes the aggregation's ttl."""
    assert ttl_specs(Builder("ttl-specs", timestamps="latest")) == {
        "users": 3600, "last": 120, "total": None, "last-timestamps": 120,
        "total-timestamps": None}


def ttl_specs(b: Builder) -> dict[str, float | None]:
    """The ttl (seconds) of each store of a table and two aggregations built on ``b``."""
    b.table("users", ttl=3600)
    grouped = b.stream("in").group_by_key()
    grouped.reduce(lambda x, y: y, "last", ttl=120)
    grouped.sum("total")
    ttls = {spec.name: getattr(spec, "ttl", None) for node in b.build().nodes
            for spec in node.stores}
    return {name: ttl and ttl.seconds for name, ttl in ttls.items()}


def test_a_ttl_with_a_stores_function_is_refused_naming_the_store() -> None:
    def mine(name: str, _windowed: bool) -> StoreSpec:
        return MemoryTable(name)

    b = Builder("ttl-own", stores=mine)
    with pytest.raises(ConfigError, match="store 'counts': ttl= takes the builder's own "
                                          "stores"):
        b.stream("in").group_by_key().count("counts", ttl=60)
