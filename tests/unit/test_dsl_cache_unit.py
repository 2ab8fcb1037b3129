"""The DSL's record cache, example by example: a table emits each key a batch changed
once, with its latest value, timestamp and headers; an aggregation after a re-keying
combines each batch's records per key before the repartition (``kasper.partial``);
``cache=False`` (builder or operator) gives one update per record again. The
properties of test_dsl_properties and test_dsl_join_properties check both modes
against record-at-a-time models."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from kasper_py.dsl import Builder
from kasper_py.dsl.packed import unpacked
from kasper_py.exceptions import SerdeError
from kasper_py.testing import ProcessorDriver, make_message

Out = tuple[Any, Any, int | None]


def driver_of(builder: Builder, partitions: int = 1) -> ProcessorDriver:
    return ProcessorDriver(builder.build(), key_serde="json", value_serde="json",
                           partitions=partitions)


def outputs(driver: ProcessorDriver, topic: str) -> list[Out]:
    def decode(raw: bytes | None) -> Any:
        return None if raw is None else json.loads(raw)

    return [(decode(m.key), decode(m.value), m.timestamp) for m in driver.sent
            if m.topic == topic]


def repartitioned(driver: ProcessorDriver) -> list[Any]:
    """The records sent through repartitions, packed ones as the records they hold."""
    return unpacked([m for m in driver.sent if m.topic.endswith("-repartition")])


def word_count(cache: bool | None = None) -> Builder:
    b = Builder("words", stores="memory") if cache is None else Builder(
        "words", stores="memory", cache=cache)
    (b.stream("lines").flat_map_values(str.split).group_by(lambda _k, word: word)
        .count("counts").to_stream().to("counts"))
    return b


def test_one_batch_of_5000_words_sends_one_record_and_one_update_per_word() -> None:
    """The issue's rule: one batch of 5,000 words over 20 distinct words sends at most
    one repartition record and one count update per word, the update being the
    word's count; the next batch adds to it."""
    rng = random.Random(5)
    vocabulary = [f"w{i}" for i in range(20)]
    words = [rng.choice(vocabulary) for _ in range(5000)]
    driver = driver_of(word_count())
    driver.process([make_message("lines", " ".join(words[n:n + 10]), timestamp=n + 1)
                    for n in range(0, 5000, 10)])
    assert len(repartitioned(driver)) == 20
    counts = outputs(driver, "counts")
    assert len(counts) == 20
    assert {w: n for w, n, _ in counts} == Counter(words)
    driver.process([make_message("lines", "w1 w1 zz", timestamp=6000)])
    assert outputs(driver, "counts")[20:] == [("w1", Counter(words)["w1"] + 2, 6000),
                                              ("zz", 1, 6000)]


def test_without_the_cache_every_word_goes_through_and_updates() -> None:
    """``cache=False``: every word crosses the repartition and updates its count."""
    driver = driver_of(word_count(cache=False))
    driver.process([make_message("lines", "a b a", timestamp=1)])
    assert len(repartitioned(driver)) == 3
    assert outputs(driver, "counts") == [("a", 1, 1), ("b", 1, 1), ("a", 2, 1)]


def test_a_combined_record_carries_its_partial_in_a_header() -> None:
    """The internal format: a combined record has a ``None`` value, the key's latest
    headers, then ``kasper.partial`` with the partial count, and the latest
    timestamp; the counting stage strips the header off."""
    b = Builder("fmt", stores="memory")
    (b.stream("in").group_by(lambda _k, v: v).count("n").to_stream().to("out"))
    driver = driver_of(b)
    driver.process([make_message("in", "x", "k1", timestamp=1, headers=(("h", b"1"),)),
                    make_message("in", "x", "k2", timestamp=2, headers=(("h", b"2"),))])
    [record] = repartitioned(driver)
    assert (record.key, record.value, record.timestamp) == (b'"x"', None, 2)
    assert record.headers == (("h", b"2"), ("kasper.partial", b"2"))
    [out] = [m for m in driver.sent if m.topic == "out"]
    assert (out.value, out.headers) == (b"2", (("h", b"2"),))


def test_sum_reduce_and_aggregate_combine_when_they_can_merge() -> None:
    """``sum``, ``reduce(associative=True)`` and ``aggregate(merge=...)`` send one
    record per key and batch; a plain ``reduce`` or ``aggregate`` sends every record.
    All four end at the same values."""
    b = Builder("merges", stores="memory")
    grouped = b.stream("in").group_by(lambda k, v: k)
    grouped.sum("sum").to_stream().to("sum")
    grouped.reduce(max, "max", associative=True).to_stream().to("max")
    grouped.reduce(max, "max-plain").to_stream().to("max-plain")
    (grouped.aggregate(list, lambda k, v, agg: [*agg, v], "all",
                       merge=lambda k, agg, part: agg + part).to_stream().to("all"))
    driver = driver_of(b)
    driver.process([make_message("in", v, "a", timestamp=v) for v in (3, 1, 4, 1, 5)])
    by_topic = Counter(m.topic.split("-", 1)[1] for m in repartitioned(driver))
    assert by_topic == {"sum-by-key-repartition": 1, "max-by-key-repartition": 1,
                        "max-plain-by-key-repartition": 5, "all-by-key-repartition": 1}
    assert outputs(driver, "sum") == [("a", 14, 5)]
    assert outputs(driver, "max") == outputs(driver, "max-plain") == [("a", 5, 5)]
    assert outputs(driver, "all") == [("a", [3, 1, 4, 1, 5], 5)]


def test_a_reset_is_sent_as_it_is_between_partials() -> None:
    """A reduce whose result is ``None`` (a delete) cannot be combined (it may depend
    on the aggregate it resets): the key's partial so far goes first, then the record
    itself, then a new partial; the result is the record-at-a-time one."""
    b = Builder("resets", stores="memory")
    (b.stream("in").group_by(lambda k, v: k)
        .reduce(lambda total, v: None if v == 0 else total + v, "sums", associative=True)
        .to_stream().to("out"))
    driver = driver_of(b)
    driver.process([make_message("in", v, "a", timestamp=i)
                    for i, v in enumerate([2, 3, 0, 4, 5], 1)])
    assert [(m.value, m.headers[-1][1] if m.headers else None)
            for m in repartitioned(driver)] == [(None, b"5"), (b"0", None), (None, b"9")]
    assert outputs(driver, "out") == [("a", 9, 5)]
    assert driver.store("sums").get_many(["a"]) == {"a": 9}


def test_a_partial_that_is_not_json_fails_the_turn() -> None:
    """A partial crosses the repartition as JSON: an aggregate JSON cannot hold is a
    ``SerdeError`` naming the repartition, never a dropped record."""
    b = Builder("sets", stores="memory")
    (b.stream("in").group_by(lambda k, v: k)
        .aggregate(set, lambda k, v, agg: agg | {v}, "sets", merge=lambda k, a, p: a | p))
    driver = driver_of(b)
    with pytest.raises(Exception, match="sets-by-key") as raised:
        driver.process([make_message("in", 1, "a", timestamp=1)])
    assert isinstance(raised.value.__cause__ or raised.value, SerdeError)


def test_table_updates_are_held_until_the_batch_ends() -> None:
    """A table's updates reach its view, its stream and a table-table join once per
    key and batch, with the latest value and timestamp; a join of both sides changed
    in the batch emits once, stamped with the later side's time; a stream-table join
    still reads the table as of each record."""
    b = Builder("held", stores="memory")
    left, right = b.table("l"), b.table("r")
    left.map_values(lambda v: v * 10).to_stream().to("view")
    left.join(right, lambda x, y: [x, y]).to_stream().to("joined")
    b.stream("s").join(left, lambda x, y: [x, y]).to("probed")
    driver = driver_of(b)
    driver.process([make_message("l", 1, "a", timestamp=1),
                    make_message("s", "x", "a", timestamp=2),
                    make_message("r", 7, "a", timestamp=3),
                    make_message("l", 2, "a", timestamp=4),
                    make_message("s", "y", "a", timestamp=5),
                    make_message("r", 8, "a", timestamp=6)])
    assert outputs(driver, "view") == [("a", 20, 4)]
    assert outputs(driver, "joined") == [("a", [2, 8], 6)]
    assert outputs(driver, "probed") == [("a", ["x", 1], 2), ("a", ["y", 2], 5)]


def test_a_table_joined_with_a_view_of_itself_emits_the_batch_end_value() -> None:
    """The diamond of test_dsl_unit with the cache: each key once, joined with its
    own view as the batch left it."""
    b = Builder("self", stores="memory")
    table = b.table("t")
    table.join(table.map_values(lambda v: v * 10), lambda x, y: [x, y]).to_stream().to("out")
    driver = driver_of(b)
    driver.process([make_message("t", 1, "a", timestamp=1),
                    make_message("t", 2, "a", timestamp=2),
                    make_message("t", 3, "b", timestamp=3)])
    assert outputs(driver, "out") == [("a", [2, 20], 2), ("b", [3, 30], 3)]


def test_the_operator_switch_overrides_the_builder() -> None:
    """``count(cache=False)`` in a caching builder, and ``cache=True`` in one that is
    not, each as asked."""
    b = Builder("mixed", stores="memory", cache=False)
    stream = b.stream("in")
    stream.group_by(lambda k, v: v).count("every", cache=False).to_stream().to("every")
    stream.group_by(lambda k, v: v).count("latest", cache=True).to_stream().to("latest")
    driver = driver_of(b)
    driver.process([make_message("in", "x", str(i), timestamp=i) for i in (1, 2, 3)])
    assert outputs(driver, "every") == [("x", 1, 1), ("x", 2, 2), ("x", 3, 3)]
    assert outputs(driver, "latest") == [("x", 3, 3)]


def test_records_written_before_combining_are_still_counted() -> None:
    """A repartition may hold plain records (written by a run without the cache) and
    combined ones: the counting stage folds the first and merges the second."""
    b = Builder("upgrade", stores="memory")
    b.stream("in").group_by(lambda k, v: v).count("n").to_stream().to("out")
    driver = driver_of(b)
    topic = "upgrade-n-by-key-repartition"
    driver.process([make_message(topic, "x", "x", timestamp=1),
                    make_message(topic, None, "x", timestamp=2,
                                 headers=(("kasper.partial", b"4"),)),
                    make_message(topic, "x", "x", timestamp=3)])
    assert outputs(driver, "out") == [("x", 6, 3)]
