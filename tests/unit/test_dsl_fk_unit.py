"""The foreign-key table join (KIP-213) against a model: whatever the order and the
batching of left and right updates, once every repartition is drained the joined
table holds, for each left row with a foreign key, ``joiner(left, right)`` (inner:
only where the right row exists), and nothing else; stale answers never win."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py.dsl import Builder
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.message import Message
from kasper_py.testing import ProcessorDriver, make_message

PARTITIONS = 3
LEFT_KEYS = ["o1", "o2"]
RIGHT_KEYS = ["c1", "c2", "c3"]


def joiner(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    return {"order": order["n"], "customer": None if customer is None else customer["name"]}


def pipeline(left: bool) -> ProcessorDriver:
    builder = Builder("fk", stores="memory")
    orders, customers = builder.table("orders"), builder.table("customers")
    orders.join_foreign(customers, lambda o: o["c"], joiner, left=left,
                        name="enriched").to_stream().to("out")
    return ProcessorDriver(builder.build(), key_serde="json", value_serde="json",
                           partitions=PARTITIONS)


def message(topic: str, key: str, value: Any, timestamp: int) -> Message:
    partition = murmur2_partition(json.dumps(key).encode(), PARTITIONS)
    return make_message(topic, value, key, partition=partition, timestamp=timestamp)


events = st.lists(st.one_of(
    st.tuples(st.just("orders"), st.sampled_from(LEFT_KEYS),
              st.one_of(st.none(), st.builds(lambda c, n: {"c": c, "n": n},
                                             st.sampled_from([*RIGHT_KEYS, None]),
                                             st.integers(0, 9)))),
    st.tuples(st.just("customers"), st.sampled_from(RIGHT_KEYS),
              st.one_of(st.none(), st.builds(lambda n: {"name": n},
                                             st.sampled_from(["Ann", "Bob", "Cy"]))))),
    max_size=25)


def model(updates: list[tuple[str, str, Any]], left: bool) -> dict[str, Any]:
    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    for topic, key, value in updates:
        if value is None:
            tables[topic].pop(key, None)
        else:
            tables[topic][key] = value
    joined = {}
    for key, order in tables["orders"].items():
        customer = tables["customers"].get(order["c"]) if order["c"] is not None else None
        if customer is not None or left:
            joined[key] = joiner(order, customer)
    return joined


@settings(max_examples=150, deadline=None)
@given(updates=events, cuts=st.lists(st.integers(0, 25), max_size=6), left=st.booleans())
def test_foreign_key_join_matches_the_model(updates: list[tuple[str, str, Any]],
                                            cuts: list[int], left: bool) -> None:
    """Updates fed in random batches: the last value emitted per left key (a None, a
    delete) equals the model's joined table, and so does the join's own store."""
    driver = pipeline(left)
    messages = [message(t, k, v, i + 1) for i, (t, k, v) in enumerate(updates)]
    bounds = sorted({0, len(messages), *(c for c in cuts if c <= len(messages))})
    for start, end in itertools.pairwise(bounds):
        driver.process(messages[start:end])
    last: dict[str, Any] = {}
    for key, value in driver.outputs("out"):
        last[key] = value
    assert {k: v for k, v in last.items() if v is not None} == model(updates, left)
    stored = {}
    for partition in range(PARTITIONS):
        store = driver.store("enriched", partition)
        stored.update(store.get_many(LEFT_KEYS))
    assert stored == model(updates, left)
