"""The streams and tables DSL (``kasper_py.dsl``), example by example: the semantics
the properties of test_dsl_properties check, each on a small input, and the defects
those properties caught, each pinned in one batch. Tests of what a table emits per
record use ``cache=False`` (Kafka Streams with record caching disabled); the cache's
own rules (one update per key and batch, combining before a repartition) are in
test_dsl_cache_unit."""

from __future__ import annotations

import json
from typing import Any

from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import Tumbling

Out = tuple[Any, Any, int | None]


def driver_of(app: App, partitions: int = 1) -> ProcessorDriver:
    return ProcessorDriver(app, key_serde="json", value_serde="json", partitions=partitions)


def outputs(driver: ProcessorDriver, topic: str) -> list[Out]:
    """What the app sent to ``topic``, decoded: (key, value, timestamp)."""
    def decode(raw: bytes | None) -> Any:
        return None if raw is None else json.loads(raw)

    return [(decode(m.key), decode(m.value), m.timestamp) for m in driver.sent
            if m.topic == topic]


def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


def test_outputs_keep_their_input_timestamps_and_headers() -> None:
    """A record's output keeps its input's timestamp and headers, through stateless
    operators, a repartition and an aggregation; a key's update for the batch (with
    the cache) has its latest record's, through the combined repartition too."""
    for cache in (False, True):
        b = Builder("stamps", stores="memory", cache=cache)
        stream = b.stream("in").map_values(lambda v: v + 1)
        stream.to("mapped")
        stream.group_by(lambda k, v: k.upper()).count("counts").to_stream().to("counts")
        driver = driver_of(b.build())
        driver.process([make_message("in", 1, "a", timestamp=10, headers=(("h", b"1"),)),
                        make_message("in", 2, "a", timestamp=20, headers=(("h", b"2"),))])
        assert outputs(driver, "mapped") == [("a", 2, 10), ("a", 3, 20)]
        assert [m.headers for m in driver.sent if m.topic == "mapped"] == [
            (("h", b"1"),), (("h", b"2"),)]
        counts = [m.headers for m in driver.sent if m.topic == "counts"]
        if cache:
            assert outputs(driver, "counts") == [("A", 2, 20)]
            assert counts == [(("h", b"2"),)]
        else:
            assert outputs(driver, "counts") == [("A", 1, 10), ("A", 2, 20)]
            assert counts == [(("h", b"1"),), (("h", b"2"),)]


def test_windowed_results_are_stamped_with_their_window_end_minus_one() -> None:
    """A windowed count is keyed ``Windowed(key, start, end)`` (a list in JSON) and
    stamped ``end - 1``; with ``emit="final"`` each window once, when stream time
    passes its end plus grace."""
    b = Builder("windows", stores="memory")
    (b.stream("in").group_by_key().windowed_by(Tumbling(0.01)).count("c", emit="final")
        .to_stream().to("out"))
    driver = driver_of(b.build())
    driver.process([make_message("in", "x", "a", timestamp=t) for t in (1, 5, 9)])
    assert outputs(driver, "out") == []
    driver.process([make_message("in", "x", "a", timestamp=12)])
    driver.process([make_message("in", "x", "a", timestamp=25)])
    assert outputs(driver, "out") == [(["a", 0, 10], 3, 9), (["a", 10, 20], 1, 19)]


def test_null_keys_and_values() -> None:
    """``None`` keys are dropped by aggregations and repartitions (no partition to go
    to) but pass through stateless operators; ``None`` values are skipped by
    aggregations."""
    b = Builder("nulls", stores="memory")
    stream = b.stream("in")
    stream.filter(lambda k, v: True).to("passed")
    stream.group_by_key().count("direct").to_stream().to("direct")
    stream.group_by(lambda k, v: k).count("repartitioned").to_stream().to("repartitioned")
    driver = driver_of(b.build())
    driver.process([make_message("in", 1, None, timestamp=1),
                    make_message("in", None, "a", timestamp=2),
                    make_message("in", 3, "a", timestamp=3)])
    assert outputs(driver, "passed") == [(None, 1, 1), ("a", None, 2), ("a", 3, 3)]
    assert outputs(driver, "direct") == [("a", 1, 3)]
    assert outputs(driver, "repartitioned") == [("a", 1, 3)]


def test_a_tombstone_deletes_a_table_entry() -> None:
    """``table(topic)``: a ``None`` value deletes the key, emitted as a delete; a
    stream record joined after it finds nothing (inner) or ``None`` (left)."""
    b = Builder("tombstones", stores="memory", cache=False)
    table = b.table("t")
    table.to_stream().to("updates")
    b.stream("s").left_join(table, pair).to("joined")
    driver = driver_of(b.build())
    driver.process([make_message("t", 1, "a", timestamp=1),
                    make_message("s", "x", "a", timestamp=2),
                    make_message("t", None, "a", timestamp=3),
                    make_message("s", "y", "a", timestamp=4)])
    assert outputs(driver, "updates") == [("a", 1, 1), ("a", None, 3)]
    assert outputs(driver, "joined") == [("a", ["x", 1], 2), ("a", ["y", None], 4)]
    assert driver.store("t").get_many(["a"]) == {}


def test_without_the_cache_a_table_emits_one_update_per_record() -> None:
    """``cache=False``: three updates of one key in one batch are three updates
    downstream, the last one winning in the store; with the cache (the default), one:
    the last."""
    for cache, expected in ((False, [("a", 2, 1), ("a", 4, 2), ("a", 6, 3)]),
                            (True, [("a", 6, 3)])):
        b = Builder("updates", stores="memory")
        b.table("t", cache=cache).map_values(lambda v: v * 2).to_stream().to("out")
        driver = driver_of(b.build())
        driver.process([make_message("t", v, "a", timestamp=v) for v in (1, 2, 3)])
        assert outputs(driver, "out") == expected
        assert driver.store("t").get_many(["a"]) == {"a": 3}


def test_an_aggregate_of_none_deletes_the_key_within_a_batch() -> None:
    """Caught by the aggregation property: an aggregate that became ``None`` was kept
    as ``None`` for the rest of the batch (the next record folded into ``None``) but
    deleted from the store, so the result depended on where the batch ended. Now
    the key is deleted at once and its next record starts afresh, in any batch."""
    b = Builder("resets", stores="memory", cache=False)
    (b.stream("in").group_by_key()
        .reduce(lambda total, v: None if v == 0 else total + v, "sums")
        .to_stream().to("out"))
    driver = driver_of(b.build())
    driver.process([make_message("in", v, "a", timestamp=i)
                    for i, v in enumerate([2, 3, 0, 4, 5], 1)])
    assert outputs(driver, "out") == [("a", 2, 1), ("a", 5, 2), ("a", None, 3),
                                      ("a", 4, 4), ("a", 9, 5)]
    assert driver.store("sums").get_many(["a"]) == {"a": 9}


def test_a_table_join_emits_nothing_for_an_upsert_with_no_partner() -> None:
    """Caught by the table-table join property against Kafka Streams' rule: an
    upsert whose other side has no value left the join without a value before and
    after, yet was emitted as a delete. Now it emits nothing; a delete always goes
    on (the key may have been joined), and a left join's left side always emits."""
    b = Builder("pairs", stores="memory", cache=False)
    mine, theirs = b.table("l"), b.table("r")
    mine.join(theirs, pair).to_stream().to("inner")
    mine.left_join(theirs, pair).to_stream().to("left")
    driver = driver_of(b.build())
    driver.process([make_message("l", 1, "a", timestamp=1),
                    make_message("r", 2, "b", timestamp=2),
                    make_message("r", 3, "a", timestamp=3),
                    make_message("l", None, "a", timestamp=4),
                    make_message("r", None, "b", timestamp=5)])
    assert outputs(driver, "inner") == [("a", [1, 3], 3), ("a", None, 4), ("b", None, 5)]
    assert outputs(driver, "left") == [("a", [1, None], 1), ("a", [1, 3], 3),
                                       ("a", None, 4), ("b", None, 5)]


def test_branches_merged_again_keep_the_record_order() -> None:
    """Caught by the diamond property: a branch merged again came out branch by
    branch (all of the first branch's records of the batch, then the second's), so
    the order after the merge depended on where batches ended. A fork whose paths
    meet again now takes its records one at a time."""
    b = Builder("diamond", stores="memory")
    small, large = b.stream("in").branch(lambda k, v: v < 5, lambda k, v: True)
    small.map_values(lambda v: -v).merge(large).to("out")
    driver = driver_of(b.build())
    driver.process([make_message("in", v, "a", timestamp=i)
                    for i, v in enumerate([1, 7, 2, 8], 1)])
    assert outputs(driver, "out") == [("a", -1, 1), ("a", 7, 2), ("a", -2, 3), ("a", 8, 4)]


def test_a_table_joined_with_a_view_of_itself_sees_each_update() -> None:
    """Caught by the diamond property: a table joined with its own map_values saw
    the table as the whole batch left it (the store written once per batch, before
    the updates went on). Each update now goes through both sides before the next."""
    b = Builder("self", stores="memory", cache=False)
    table = b.table("t")
    table.join(table.map_values(lambda v: v * 10), pair).to_stream().to("out")
    driver = driver_of(b.build())
    driver.process([make_message("t", 1, "a", timestamp=1),
                    make_message("t", 2, "a", timestamp=2)])
    assert outputs(driver, "out") == [("a", [1, 10], 1), ("a", [1, 10], 1),
                                      ("a", [2, 20], 2), ("a", [2, 20], 2)]


def test_a_branch_no_predicate_holds_for_drops_the_record() -> None:
    """``branch``: the first predicate that holds wins; none: the record is dropped."""
    b = Builder("branches", stores="memory")
    low, high = b.stream("in").branch(lambda k, v: v < 3, lambda k, v: v > 6)
    low.to("low")
    high.to("high")
    driver = driver_of(b.build())
    driver.process([make_message("in", v, "k", timestamp=v) for v in (1, 5, 9)])
    assert outputs(driver, "low") == [("k", 1, 1)]
    assert outputs(driver, "high") == [("k", 9, 9)]


def test_at_a_timestamp_tie_across_topics_the_batch_decides() -> None:
    """A stage orders a batch's topics by timestamp; at a tie, the topic that came
    first in the batch goes first, so the outcome of a tie across topics depends on
    the batches (the property tests avoid such ties). Here the stream record and the
    table update share timestamp 5: in one batch the stream, first in it, misses the
    update; in two batches, the table's first, it meets it."""
    def joined(batches: list[list[tuple[str, Any]]]) -> list[Out]:
        b = Builder("ties", stores="memory")
        b.stream("s").join(b.table("t"), pair).to("out")
        driver = driver_of(b.build())
        for batch in batches:
            driver.process([make_message(topic, v, "a", timestamp=5) for topic, v in batch])
        return outputs(driver, "out")

    assert joined([[("s", "x"), ("t", 1)]]) == []
    assert joined([[("t", 1)], [("s", "x")]]) == [("a", ["x", 1], 5)]


def test_a_rekeyed_stream_meets_the_table_after_its_repartition() -> None:
    """A re-keyed stream joins through a repartition, read in a later turn than the
    table's records of the same batch: it meets the table as that batch left it,
    not as of its own timestamp (Kafka Streams has the same race between a
    repartition topic and a table topic). The property tests join co-partitioned
    streams only."""
    b = Builder("rekeyed", stores="memory")
    (b.stream("s").select_key(lambda k, v: v).join(b.table("t"), pair).to("out"))
    driver = driver_of(b.build())
    driver.process([make_message("s", "a", "x", timestamp=1),
                    make_message("t", 1, "a", timestamp=2)])
    assert outputs(driver, "out") == [("a", ["a", 1], 1)]


def test_a_key_set_inside_a_flat_map_does_not_leak_into_the_next_value() -> None:
    """Caught by the stateless property when chains were fused into one loop: a key
    ``select_key`` set for one value of a ``flat_map_values`` was the key the next value
    started from. Each value now starts from its record's key."""
    b = Builder("fused", stores="memory")
    (b.stream("in").flat_map_values(lambda v: [v, v + 1]).select_key(lambda k, v: f"{k}/{v}")
        .to("out"))
    driver = driver_of(b.build())
    driver.process([make_message("in", 1, "a", timestamp=1)])
    assert outputs(driver, "out") == [("a/1", 1, 1), ("a/2", 2, 1)]
