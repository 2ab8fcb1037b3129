"""The streams and tables DSL (``kasper_py.dsl``) against a brute-force model, with
hypothesis: each operator, the aggregations, windows, tables and joins.

The input of a test is ONE interleaved sequence of events over the app's topics,
with non-decreasing timestamps, split into batches at random points (each batch a
contiguous slice); the driver gets a batch's messages, which the stage regroups topic
by topic and re-merges by timestamp. The model is a plain-Python, record-at-a-time
interpretation of the same pipeline over the whole sequence in order, so every
property here says: the result does not depend on where batches end.

Semantics the properties pin down (Kafka Streams' where they overlap):

- a record's output keeps its input timestamp; a windowed result is stamped with its
  window's end - 1 (the last instant it covers);
- aggregations, joins and repartitions drop records with a ``None`` key;
  aggregations skip ``None`` values, stream-table joins drop them;
- a table's ``None`` value (a tombstone) deletes its key;
- a table emits one update per input record that changes it, never coalesced per
  batch, so its update sequence is the same however the input is batched (windowed
  aggregations with ``emit="updates"`` are the exception: one update per window a
  batch changed, so only their last value per window is compared);
- two events of different topics never share a timestamp in these inputs: a stage
  orders a batch's topics by timestamp, and at a tie across topics the order depends
  on which topic came first in the batch (``test_dsl_unit`` shows it), so no
  order would be invariant to batch ends there.

Timestamps start at 1: a produced record with timestamp 0 means "now" to the Kafka
producer (``OutgoingMessage`` turns 0 into ``None``).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_windows_properties import Model as WindowsModel
from test_windows_properties import kinds as window_kinds

from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import WindowKind, sum_of

Event = tuple[str, Any, Any, int]
"""(topic, key, value, timestamp ms)."""
Out = tuple[Any, Any, int | None]
"""(key, value, timestamp) of an output record, decoded."""

FAST = settings(max_examples=80, deadline=None)

keys = st.sampled_from(["a", "b", "c", None])
values = st.one_of(st.integers(0, 9), st.none())
cuts = st.lists(st.integers(0, 200), max_size=5)


def events(topics: list[str], key: st.SearchStrategy[Any] = keys,
           value: st.SearchStrategy[Any] = values, max_size: int = 40
           ) -> st.SearchStrategy[list[Event]]:
    """One interleaved sequence over ``topics``, timestamps non-decreasing from 1,
    strictly increasing where the topic changes."""
    steps = st.lists(st.tuples(st.sampled_from(topics), key, value, st.integers(0, 3)),
                     max_size=max_size)

    def stamp(raw: list[tuple[str, Any, Any, int]]) -> list[Event]:
        out: list[Event] = []
        now, last_topic = 1, None
        for topic, k, v, step in raw:
            now += max(step, 1) if last_topic not in (None, topic) else step
            out.append((topic, k, v, now))
            last_topic = topic
        return out

    return steps.map(stamp)


def partition_of(key: Any, partitions: int) -> int:
    """The partition a producer puts ``key`` in (JSON-encoded); ``None``: 0."""
    if key is None or partitions == 1:
        return 0
    return murmur2_partition(json.dumps(key).encode(), partitions)


def run(app: App, sequence: list[Event], at: list[int], *, partitions: int = 1,
        spread: Callable[[Event], int] | None = None) -> ProcessorDriver:
    """Drive ``app`` over ``sequence`` in batches split at ``at`` (positions modulo
    the length); each event in ``spread(event)``'s partition, else its key's."""
    driver = ProcessorDriver(app, key_serde="json", value_serde="json",
                             partitions=partitions)
    bounds = sorted({0, len(sequence), *(c % (len(sequence) + 1) for c in at)})
    for low, high in itertools.pairwise(bounds):
        driver.process([make_message(
            topic, value, key, timestamp=ts,
            partition=spread((topic, key, value, ts)) if spread else partition_of(
                key, partitions)) for topic, key, value, ts in sequence[low:high]])
    return driver


def outputs(driver: ProcessorDriver, topic: str) -> list[Out]:
    """What the app sent to ``topic``, decoded, in order."""
    def decode(raw: bytes | None) -> Any:
        return None if raw is None else json.loads(raw)

    return [(decode(m.key), decode(m.value), m.timestamp) for m in driver.sent
            if m.topic == topic]


def per_key(records: list[Out]) -> dict[Any, list[Out]]:
    """Records grouped by key, each key's in order."""
    grouped: dict[Any, list[Out]] = defaultdict(list)
    for record in records:
        grouped[json.dumps(record[0])].append(record)
    return dict(grouped)


def builder() -> Builder:
    return Builder("props", stores="memory")


# -- stateless operators -------------------------------------------------------------

def keep(key: Any, value: Any) -> bool:
    return value is not None and value % 3 != 0


def stateless(b: Builder) -> None:
    """Every stateless operator in one pipeline, a topic per branch."""
    seen = b.stream("in").peek(lambda k, v: None)
    merged = seen.merge(b.stream("other"))
    odd, rest = merged.filter(lambda k, v: v is not None).branch(
        lambda k, v: v % 2 == 1, lambda k, v: True)
    odd.filter_not(lambda k, v: v == 5).map(lambda k, v: (v, [k, v])).to("odd")
    (rest.flat_map_values(lambda v: range(v % 3)).map_values(lambda v: v * 10)
        .select_key(lambda k, v: f"{k}/{v}").to("rest"))
    merged.flat_map(lambda k, v: [(k, v), (None, k)] if v == 4 else []).to("fours")
    merged.filter(keep).to("kept")


def stateless_model(sequence: list[Event]) -> dict[str, list[Out]]:
    out: dict[str, list[Out]] = defaultdict(list)
    for _topic, k, v, ts in sequence:
        if v is not None and v % 2 == 1:
            if v != 5:
                out["odd"].append((v, [k, v], ts))
        elif v is not None:
            out["rest"] += [(f"{k}/{x * 10}", x * 10, ts) for x in range(v % 3)]
        if v == 4:
            out["fours"] += [(k, v, ts), (None, k, ts)]
        if keep(k, v):
            out["kept"].append((k, v, ts))
    return out


@FAST
@given(events(["in", "other"]), cuts)
def test_stateless_operators_equal_the_model(sequence: list[Event], at: list[int]) -> None:
    """filter/filter_not, map/map_values, flat_map/flat_map_values, select_key, peek,
    branch (first match wins), merge (the topics in timestamp order) and to: each
    output topic gets the model's records in the model's order, each stamped with its
    input's timestamp; ``None`` keys pass through stateless operators and ``to``."""
    b = builder()
    stateless(b)
    driver = run(b.build(), sequence, at)
    model = stateless_model(sequence)
    for topic in ("odd", "rest", "fours", "kept"):
        assert outputs(driver, topic) == model[topic], topic


@FAST
@given(events(["in"]), cuts, st.integers(1, 3))
def test_through_keeps_per_key_order_and_drops_null_keys(
        sequence: list[Event], at: list[int], partitions: int) -> None:
    """through a repartition: every keyed record arrives once with its timestamp, and
    the records of one key from one source partition in their order (the value is
    the original key, which decided the source partition); ``None`` keys are dropped
    (no partition to go to)."""
    b = builder()
    b.stream("in").map(lambda k, v: (v, k)).through("swap").to("out")
    driver = run(b.build(), sequence, at, partitions=partitions)

    def by_origin(records: list[Out]) -> dict[Any, list[Out]]:
        grouped: dict[Any, list[Out]] = defaultdict(list)
        for record in records:
            grouped[record[0], partition_of(record[1], partitions)].append(record)
        return dict(grouped)

    expected = [(v, k, ts) for _t, k, v, ts in sequence if v is not None]
    assert by_origin(outputs(driver, "out")) == by_origin(expected)


# -- grouped aggregations --------------------------------------------------------------

def add_or_reset(_key: Any, value: int, aggregate: list[int]) -> list[int] | None:
    """Appends ``value``; a 0 resets the aggregate (``None``: deleted)."""
    return None if value == 0 else [*aggregate, value]


def max_or_reset(aggregate: int, value: int) -> int | None:
    """The larger; a 0 resets the aggregate (``None``: deleted)."""
    return None if value == 0 else max(aggregate, value)


def aggregations(b: Builder, rekey: bool) -> None:
    stream = b.stream("in", "other")
    grouped = (stream.group_by(lambda k, v: k.upper() if k else None) if rekey
               else stream.group_by_key())
    grouped.count("counts").to_stream().to("counts")
    grouped.reduce(max_or_reset, "maxima").to_stream().to("maxima")
    grouped.aggregate(list, add_or_reset, "lists").to_stream().to("lists")


def aggregations_model(sequence: list[Event], rekey: bool) -> dict[str, list[Out]]:
    """A dict per aggregation folded record by record; a ``None`` aggregate deletes
    the key, and the next record starts afresh (from the initializer, or as a
    reduce's first value)."""
    tables: dict[str, dict[Any, Any]] = {"counts": {}, "maxima": {}, "lists": {}}
    out: dict[str, list[Out]] = defaultdict(list)
    for _topic, k, v, ts in sequence:
        key = (k.upper() if k else None) if rekey else k
        if key is None or v is None:
            continue
        counts, maxima, lists = tables["counts"], tables["maxima"], tables["lists"]
        counts[key] = counts.get(key, 0) + 1
        maxima[key] = v if key not in maxima else max_or_reset(maxima[key], v)
        lists[key] = add_or_reset(key, v, lists.get(key, []))
        for name, table in tables.items():
            out[name].append((key, table[key], ts))
            if table[key] is None:
                del table[key]
    return out


@FAST
@given(events(["in", "other"], value=st.one_of(st.integers(0, 4), st.none())), cuts,
       st.booleans(), st.integers(1, 3))
def test_aggregations_emit_the_model_updates(sequence: list[Event], at: list[int],
                                             rekey: bool, partitions: int) -> None:
    """count, reduce and aggregate of two merged topics, after group_by (a
    repartition) or group_by_key: one update per record with a key and a value, each
    key's updates in the model's order with the record's timestamp; an aggregate that
    becomes ``None`` is a delete, and the key's next record starts afresh; the store
    ends as the model's final table. Keys are spread over ``partitions`` by their
    original key, which decides the grouped key, so each grouped key's records stay
    in order."""
    b = builder()
    aggregations(b, rekey)
    driver = run(b.build(), sequence, at, partitions=partitions)
    model = aggregations_model(sequence, rekey)
    for name in ("counts", "maxima", "lists"):
        assert per_key(outputs(driver, name)) == per_key(model[name]), name
        last = {k: v for k, v, _ in model[name]}
        final = {k: v for k, v in last.items() if v is not None}
        stored = {}
        for p in range(partitions):
            stored.update(driver.store(name, p).get_many(["a", "b", "c", "A", "B", "C"]))
        assert stored == final


@FAST
@given(st.lists(st.tuples(st.text("xyz", max_size=6), st.integers(0, 3)), max_size=25),
       cuts, st.integers(1, 3))
def test_word_count_over_partitions(lines: list[tuple[str, int]], at: list[int],
                                    partitions: int) -> None:
    """Words of lines in any source partition, counted after a repartition: each
    word's counts go 1, 2, ... n in order (per-key order through the repartition) and
    end at the model's count."""
    b = builder()
    (b.stream("lines").flat_map_values(list).group_by(lambda _k, w: w).count("counts")
        .to_stream().to("counts"))
    sequence = [("lines", i, line, i + 1) for i, (line, _) in enumerate(lines)]
    spread = {i + 1: p % partitions for i, (_, p) in enumerate(lines)}
    driver = run(b.build(), sequence, at, partitions=partitions,
                 spread=lambda e: spread[e[3]])
    counted: dict[str, list[int]] = defaultdict(list)
    for word, n, _ in outputs(driver, "counts"):
        counted[word].append(n)
    words: dict[str, int] = defaultdict(int)
    for line, _ in lines:
        for word in line:
            words[word] += 1
    assert counted == {w: list(range(1, n + 1)) for w, n in words.items()}


# -- windows ---------------------------------------------------------------------------

windowed_events = st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.integers(1, 300),
                                     st.one_of(st.integers(1, 5), st.none())),
                           max_size=40).map(
    lambda raw: [("in", k, v, ts) for k, ts, v in raw])
"""Out of order by up to 300 ms (one topic: no tie across topics)."""


class PartitionedWindows:
    """The windows model of each partition (stream time is a partition's), keys
    spread as the driver spreads them."""

    def __init__(self, kind: WindowKind, sequence: list[Event], partitions: int) -> None:
        self.models = [WindowsModel(kind) for _ in range(partitions)]
        for _topic, k, v, ts in sequence:
            if k is not None and v is not None:
                self.models[partition_of(k, partitions)].add(k, ts, v)

    def windows(self, closed: bool | None = None) -> dict[tuple[Any, int, int], Any]:
        """Every window with its sum; only the closed (or open) ones if ``closed``."""
        return {w: v for model in self.models for w, v in model.windows().items()
                if closed is None or model.closed(w) is closed}


def windowed_app(kind: WindowKind, emit: Any, rekey: bool) -> App:
    b = builder()
    stream = b.stream("in")
    grouped = stream.group_by(lambda k, v: k) if rekey else stream.group_by_key()
    (grouped.windowed_by(kind).aggregate(sum_of(), "sums", emit=emit).to_stream()
        .to("out"))
    return b.build()


@settings(max_examples=100, deadline=None)
@given(window_kinds(), windowed_events, cuts, st.booleans(), st.integers(1, 2))
def test_windowed_final_emits_each_closed_window_once(
        kind: WindowKind, sequence: list[Event], at: list[int], rekey: bool,
        partitions: int) -> None:
    """emit="final": each window the model has closed is emitted once, with the
    model's sum, keyed ``Windowed(key, start, end)`` and stamped ``end - 1``; late
    records are dropped as the model drops them; ``None`` keys and values skipped.
    Over partitions (records spread by key, grouped by the same key: each key's
    records in order), each partition has its own stream time."""
    driver = run(windowed_app(kind, "final", rekey), sequence, at, partitions=partitions)
    model = PartitionedWindows(kind, sequence, partitions)
    emitted = [((k[0], k[1], k[2]), v, ts) for k, v, ts in outputs(driver, "out")]
    assert len({w for w, _, _ in emitted}) == len(emitted), "a window emitted twice"
    assert all(ts == w[2] - 1 for w, _, ts in emitted)
    assert {w: v for w, v, _ in emitted} == model.windows(closed=True)


@settings(max_examples=100, deadline=None)
@given(window_kinds(), windowed_events, cuts, st.booleans(), st.integers(1, 2))
def test_windowed_updates_end_at_the_model(
        kind: WindowKind, sequence: list[Event], at: list[int], rekey: bool,
        partitions: int) -> None:
    """emit="updates": the last update of each window is the model's sum (a session
    merged into a larger one ends deleted: ``None``), stamped ``end - 1``. Updates
    are per window a batch changed, so only the last one is batch-split invariant."""
    driver = run(windowed_app(kind, "updates", rekey), sequence, at, partitions=partitions)
    model = PartitionedWindows(kind, sequence, partitions)
    last: dict[tuple[Any, int, int], Any] = {}
    for k, v, ts in outputs(driver, "out"):
        assert ts == k[2] - 1
        last[k[0], k[1], k[2]] = v
    assert {w: v for w, v in last.items() if v is not None} == model.windows()


# -- tables ----------------------------------------------------------------------------

@FAST
@given(events(["t"]), cuts, st.integers(1, 3))
def test_table_upserts_and_deletes(sequence: list[Event], at: list[int],
                                   partitions: int) -> None:
    """table(topic): every record with a key is an update emitted as it came (its
    timestamp kept, a ``None`` value a delete); filter emits a delete for an update
    that fails it, map_values maps the rest; the store ends as the model's dict, and
    ``None`` keys are dropped."""
    b = builder()
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
    assert per_key(outputs(driver, "updates")) == per_key(updates)
    assert per_key(outputs(driver, "even")) == per_key(even)
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


def table_join_model(sequence: list[Event], left: bool, view: bool) -> dict[str, list[Out]]:
    """A table-table join record by record ("out"): an update emits the key's joined
    value, or ``None`` when the join has none now; except an upsert finding the
    other side absent (the join has no value before or after; a left join's left
    side always emits). Deletes always go on: the key may have been joined before.
    The right table is read through ``view_of`` when ``view``, and a stream "s"
    probes the joined table ("probe")."""
    sides: dict[str, dict[Any, Any]] = {"l": {}, "r": {}}
    out: dict[str, list[Out]] = defaultdict(list)
    for topic, k, raw, ts in sequence:
        if k is None:
            continue
        lv, rv = sides["l"].get(k), sides["r"].get(k)
        joined = None if lv is None or (rv is None and not left) else [lv, rv]
        if topic == "s":
            if raw is not None and joined is not None:
                out["probe"].append((k, [raw, joined], ts))
            continue
        v = view_of(raw) if view and topic == "r" else raw
        mine, other = sides[topic], sides["r" if topic == "l" else "l"]
        mine.pop(k, None) if v is None else mine.__setitem__(k, v)
        lv, rv = sides["l"].get(k), sides["r"].get(k)
        if v is None or (topic == "l" and left) or other.get(k) is not None:
            out["out"].append((k, None if lv is None or (rv is None and not left)
                               else [lv, rv], ts))
    return out


@FAST
@given(events(["l", "r", "s"]), cuts, st.booleans(), st.booleans(), st.integers(1, 3))
def test_table_table_join_equals_the_model(sequence: list[Event], at: list[int],
                                           left: bool, view: bool, partitions: int) -> None:
    """Table-table join and left_join (the right side a view, or not): each update
    emits the model's joined value at that point (see ``table_join_model``), with
    its timestamp; the joined table ends as the join of the model's final tables;
    a stream joined with the joined table meets its value as of each record."""
    b = builder()
    mine, theirs = b.table("l"), b.table("r")
    if view:
        theirs = theirs.filter(lambda k, v: v % 3 != 0).map_values(lambda v: v + 100)
    joined = mine.left_join(theirs, pair) if left else mine.join(theirs, pair)
    joined.to_stream().to("out")
    b.stream("s").join(joined, pair).to("probe")
    driver = run(b.build(), sequence, at, partitions=partitions)
    expected = table_join_model(sequence, left, view)
    got = outputs(driver, "out")
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
@given(events(["t"]), cuts)
def test_a_table_joined_with_a_view_of_itself(sequence: list[Event], at: list[int]) -> None:
    """A table joined with its own ``map_values``: each update reaches the join's left
    side, then (through the view) its right side, and each side sees the table as of
    that update, never as the batch leaves it: two updates per record, the joined
    value of the record's own value."""
    b = builder()
    table = b.table("t")
    table.join(table.map_values(lambda v: v * 10), pair).to_stream().to("out")
    driver = run(b.build(), sequence, at)
    expected = [(k, None if v is None else [v, v * 10], ts)
                for _t, k, v, ts in sequence if k is not None for _ in range(2)]
    assert outputs(driver, "out") == expected
