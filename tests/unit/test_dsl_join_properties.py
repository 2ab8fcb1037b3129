"""Tables, joins and diamonds of the streams and tables DSL against a brute-force
model, with hypothesis: one interleaved sequence of events over the topics, split
into batches at random points, through the app and through a record-at-a-time model
(see test_dsl_properties for the harness and the semantics written down there).

Joins here are co-partitioned (keys spread over partitions by the producer's
partitioner): a re-keyed stream reaches a table through a repartition, read in a
later turn, so what it meets depends on the turns (test_dsl_unit shows it).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_dsl_properties import (
    FAST,
    Event,
    Out,
    assert_coalesced,
    builder,
    cuts,
    events,
    outputs,
    per_key,
    run,
)

# -- tables ----------------------------------------------------------------------------

@FAST
@given(events(["t"]), cuts, st.integers(1, 3), st.booleans())
def test_table_upserts_and_deletes(sequence: list[Event], at: list[int],
                                   partitions: int, cache: bool) -> None:
    """table(topic): every record with a key is an update emitted as it came (its
    timestamp kept, a ``None`` value a delete), or with the cache each key's latest
    of the batch; filter emits a delete for an update that fails it, map_values maps
    the rest; the store ends as the model's dict, and ``None`` keys are dropped."""
    b = builder(cache)
    table = b.table("t")
    table.to_stream().to("updates")
    table.filter(lambda k, v: v % 2 == 0).map_values(lambda v: v * 10).to_stream().to("even")
    driver = run(b.build(), sequence, at, partitions=partitions)
    model: dict[Any, Any] = {}
    updates, even = [], []
    for _t, k, v, ts in sequence:
        if k is None:
            continue
        model.pop(k, None) if v is None else model.__setitem__(k, v)
        updates.append((k, v, ts))
        even.append((k, v * 10 if v is not None and v % 2 == 0 else None, ts))
    for topic, model_updates in (("updates", updates), ("even", even)):
        if cache:
            assert_coalesced(outputs(driver, topic), model_updates)
        else:
            assert per_key(outputs(driver, topic)) == per_key(model_updates)
    stored: dict[Any, Any] = {}
    for p in range(partitions):
        stored.update(driver.store("t", p).get_many(["a", "b", "c"]))
    assert stored == model


# -- joins -----------------------------------------------------------------------------

def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


def view_of(value: Any) -> Any:
    """The table view the joins may read: values divisible by 3 filtered out, the rest
    plus 100."""
    return None if value is None or value % 3 == 0 else value + 100


@FAST
@given(events(["s", "t"]), cuts, st.booleans(), st.booleans(), st.integers(1, 3))
def test_stream_table_join_equals_the_model(sequence: list[Event], at: list[int],
                                            left: bool, view: bool, partitions: int) -> None:
    """Stream-table join and left_join, co-partitioned, with the table or a view of it
    (filter, map_values): each stream record meets the table as the events before it
    in the sequence left it, whatever the batches; stream records with a ``None`` key
    or value are dropped; the inner join drops those without a table value, the left
    join joins them with ``None``; the output keeps the stream record's timestamp."""
    b = builder()
    stream, table = b.stream("s"), b.table("t")
    if view:
        table = table.filter(lambda k, v: v % 3 != 0).map_values(lambda v: v + 100)
    (stream.left_join(table, pair) if left else stream.join(table, pair)).to("out")
    driver = run(b.build(), sequence, at, partitions=partitions)
    model: dict[Any, Any] = {}
    expected = []
    for topic, k, v, ts in sequence:
        if k is None:
            continue
        if topic == "t":
            value = view_of(v) if view else v
            model.pop(k, None) if value is None else model.__setitem__(k, value)
        elif v is not None and (left or k in model):
            expected.append((k, [v, model.get(k)], ts))
    assert per_key(outputs(driver, "out")) == per_key(expected)


@FAST
@given(events(["s", "in"]), cuts, st.integers(1, 3))
def test_stream_joined_with_an_aggregation(sequence: list[Event], at: list[int],
                                           partitions: int) -> None:
    """A stream joined with a count of another (co-partitioned, one stage): each
    record meets the count as the records before it made it."""
    b = builder()
    counts = b.stream("in").group_by_key().count("counts")
    b.stream("s").join(counts, pair).to("out")
    driver = run(b.build(), sequence, at, partitions=partitions)
    model: dict[Any, int] = defaultdict(int)
    expected = []
    for topic, k, v, ts in sequence:
        if k is None or v is None:
            continue
        if topic == "in":
            model[k] += 1
        elif k in model:
            expected.append((k, [v, model[k]], ts))
    assert per_key(outputs(driver, "out")) == per_key(expected)


def joined_value(how: str, lv: Any, rv: Any) -> Any:
    """The value of a key in the joined table: ``None`` when the join has none."""
    if (lv is None and rv is None) or (lv is None and how != "outer") \
            or (rv is None and how == "inner"):
        return None
    return [lv, rv]


def table_join_model(sequence: list[Event], how: str, view: bool) -> dict[str, list[Out]]:
    """A table-table join record by record ("out"): an update emits the key's joined
    value, or ``None`` when the join has none now; except an upsert finding the
    other side absent (the join has no value before or after; a left join's left
    side and both sides of an outer join always emit). Deletes always go on: the key
    may have been joined before.
    The right table is read through ``view_of`` when ``view``, and a stream "s"
    probes the joined table ("probe"). An update is stamped with the larger of its
    time and the other side's (when that side has a value); "final" holds, per key
    the join ends with a value, the stamp of its last update (which the cache's
    flush, reading both sides as the batch left them, gives too)."""
    sides: dict[str, dict[Any, Any]] = {"l": {}, "r": {}}
    times: dict[str, dict[Any, int]] = {"l": {}, "r": {}}
    out: dict[str, list[Out]] = defaultdict(list)
    for topic, k, raw, ts in sequence:
        if k is None:
            continue
        joined = joined_value(how, sides["l"].get(k), sides["r"].get(k))
        if topic == "s":
            if raw is not None and joined is not None:
                out["probe"].append((k, [raw, joined], ts))
            continue
        v = view_of(raw) if view and topic == "r" else raw
        mine, other = sides[topic], sides["r" if topic == "l" else "l"]
        mine.pop(k, None) if v is None else mine.__setitem__(k, v)
        times[topic][k] = ts
        theirs = "r" if topic == "l" else "l"
        stamp = max(ts, times[theirs][k]) if k in other else ts
        if v is None or (topic == "l" and how == "left") or how == "outer" \
                or other.get(k) is not None:
            out["out"].append((k, joined_value(how, sides["l"].get(k), sides["r"].get(k)),
                               stamp))
    last = {k: t for k, _, t in out["out"]}
    for k in sides["l"].keys() | sides["r"].keys():
        if joined_value(how, sides["l"].get(k), sides["r"].get(k)) is not None:
            out["final"].append((k, None, last[k]))
    return out


def unstamped(records: list[Out]) -> list[Out]:
    """``records`` without their timestamps."""
    return [(k, v, None) for k, v, _ in records]


@FAST
@given(events(["l", "r", "s"]), cuts, st.sampled_from(["inner", "left", "outer"]),
       st.booleans(), st.integers(1, 3), st.booleans())
def test_table_table_join_equals_the_model(sequence: list[Event], at: list[int],  # noqa: PLR0917
                                           how: str, view: bool, partitions: int,
                                           cache: bool) -> None:
    """Table-table join, left_join and outer_join (the right side a view, or not): each update
    emits the model's joined value at that point (see ``table_join_model``), stamped
    with the larger of the two sides' times; or with the cache each key's as the batch
    left it (its values a subsequence of the model's, the same last values: a key the
    model last deleted may have no update), stamped as the batch left the two sides,
    so a key the join ends with carries the stamp of its last model update; the
    joined table ends as the join of the model's final tables; a stream joined with
    the joined table meets its value as of each record."""
    b = builder(cache)
    mine, theirs = b.table("l"), b.table("r")
    if view:
        theirs = theirs.filter(lambda k, v: v % 3 != 0).map_values(lambda v: v + 100)
    joined = {"inner": mine.join, "left": mine.left_join, "outer": mine.outer_join}[how](
        theirs, pair)
    joined.to_stream().to("out")
    b.stream("s").join(joined, pair).to("probe")
    driver = run(b.build(), sequence, at, partitions=partitions)
    expected = table_join_model(sequence, how, view)
    got = outputs(driver, "out")
    if cache:
        assert_coalesced(unstamped(got), unstamped(expected["out"]), same_keys=False)
        last = {k: (v, t) for k, v, t in got}
        assert {k: last[k][1] for k, _, _ in expected["final"]} == {
            k: t for k, _, t in expected["final"]}
    else:
        assert per_key(got) == per_key(expected["out"])
        assert {k: v for k, v, _ in got} == {k: v for k, v, _ in expected["out"]}
    assert per_key(outputs(driver, "probe")) == per_key(expected["probe"])


# -- diamonds: a fork whose paths meet again -----------------------------------------

@FAST
@given(events(["in"], value=st.integers(0, 9)), cuts)
def test_branches_merged_again_keep_the_record_order(sequence: list[Event],
                                                     at: list[int]) -> None:
    """branch, then merge the branches (and merge a stream with a map of itself):
    records come out in the order a record-at-a-time run gives (each record through
    its branch; a record through both paths before the next, the path declared first
    first: here the ``map_values``, made before ``merge`` was called), so an
    aggregation after the merge folds them in that order too."""
    b = builder()
    odd, even = b.stream("in").branch(lambda k, v: v % 2 == 1, lambda k, v: True)
    merged = odd.map_values(lambda v: -v).merge(even)
    merged.to("merged")
    merged.group_by_key().aggregate(list, lambda k, v, agg: [*agg, v], "lists")
    both = b.stream("other")
    both.merge(both.map_values(lambda v: v * 100)).to("both")
    driver = run(b.build(), [(("in", k, v, ts)) for _t, k, v, ts in sequence]
                 + [("other", k, v, 10_000 + ts) for _t, k, v, ts in sequence], at)
    expected = [(k, -v if v % 2 == 1 else v, ts) for _t, k, v, ts in sequence]
    assert outputs(driver, "merged") == expected
    assert outputs(driver, "both") == [
        r for _t, k, v, ts in sequence for r in ((k, v * 100, 10_000 + ts), (k, v, 10_000 + ts))]
    lists: dict[Any, list[int]] = defaultdict(list)
    for k, v, _ in expected:
        if k is not None:
            lists[k].append(v)
    assert driver.store("lists").get_many(["a", "b", "c"]) == lists


@FAST
@given(events(["t"]), cuts, st.booleans())
def test_a_table_joined_with_a_view_of_itself(sequence: list[Event], at: list[int],
                                              cache: bool) -> None:
    """A table joined with its own ``map_values``: each update reaches the join's left
    side, then (through the view) its right side, and each side sees the table as of
    that update, never as the batch leaves it: two updates per record, the joined
    value of the record's own value; with the cache, each key's last of the batch."""
    b = builder(cache)
    table = b.table("t")
    table.join(table.map_values(lambda v: v * 10), pair).to_stream().to("out")
    driver = run(b.build(), sequence, at)
    expected = [(k, None if v is None else [v, v * 10], ts)
                for _t, k, v, ts in sequence if k is not None for _ in range(2)]
    if cache:
        assert_coalesced(outputs(driver, "out"), expected)
    else:
        assert outputs(driver, "out") == expected
