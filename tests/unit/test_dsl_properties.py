"""The streams and tables DSL (``kasper_py.dsl``) against a brute-force model, with
hypothesis: each operator, the aggregations, windows, tables and joins.

The input of a test is ONE interleaved sequence of events over the app's topics,
with non-decreasing timestamps, split into batches at random points (each batch a
contiguous slice); the driver gets a batch's messages, which the stage regroups topic
by topic and re-merges by timestamp. The model is a plain-Python, record-at-a-time
interpretation of the same pipeline over the whole sequence in order, so every
property here says: the result does not depend on where batches end. Tables, joins
and diamonds (forks whose paths meet again) are in test_dsl_join_properties, on the
helpers of this module.

Semantics the properties pin down (Kafka Streams' where they overlap):

- a record's output keeps its input timestamp; a windowed result is stamped with its
  window's end - 1 (the last instant it covers); an aggregate's update with the
  largest timestamp folded into it since it was last deleted, a table-table join's
  with the larger of its two sides' (Kafka Streams' timestamped stores);
- aggregations, joins and repartitions drop records with a ``None`` key;
  aggregations skip ``None`` values, stream-table joins drop them;
- a table's ``None`` value (a tombstone) deletes its key;
- without the cache (``cache=False``) a table emits one update per input record that
  changes it, so its update sequence is the same however the input is batched;
  with the cache (the default) each key a batch changed once, with its latest value
  and timestamp: each key's updates are then a subsequence of the record-at-a-time
  ones, ending at the same last one (``assert_coalesced``). Windowed aggregations
  with ``emit="updates"`` emit once per window a batch changed either way, so only
  their last value per window is compared;
- with the cache, a re-keyed ``count``, ``reduce(associative=True)`` and
  ``aggregate(merge=...)`` combine each batch's records per key before the
  repartition: the same final tables and last updates as record by record;
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
from kasper_py.dsl import Builder, Timestamps
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


def builder(cache: bool = True, timestamps: Timestamps = "latest") -> Builder:
    """The properties' builder: Kafka Streams' stamps (``timestamps="latest"``) unless
    a property pins down the default's."""
    return Builder("props", stores="memory", cache=cache, timestamps=timestamps)


def is_subsequence(part: list[Out], whole: list[Out]) -> bool:
    rest = iter(whole)
    return all(any(item == candidate for candidate in rest) for item in part)


def assert_coalesced(got: list[Out], model: list[Out], *, same_keys: bool = True) -> None:
    """``got``, a cached table's updates, against ``model``, the record-at-a-time ones:
    each key's updates (value and timestamp) are a subsequence of the model's, and
    the last value of each key is the model's (keys the model last deleted may have
    no update at all unless ``same_keys``)."""
    have, want = per_key(got), per_key(model)
    for key, updates in have.items():
        assert is_subsequence(updates, want.get(key, [])), (key, updates, want.get(key))
    last = {k: v[-1][1] for k, v in have.items()}
    wanted = {k: v[-1][1] for k, v in want.items()}
    if same_keys:
        assert last == wanted
    else:
        assert {k: v for k, v in last.items() if v is not None} == {
            k: v for k, v in wanted.items() if v is not None}


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
    """count, reduce and aggregate: combinable (associative, with a merge) when the
    builder caches and so combines."""
    stream = b.stream("in", "other")
    grouped = (stream.group_by(lambda k, v: k.upper() if k else None) if rekey
               else stream.group_by_key())
    grouped.count("counts").to_stream().to("counts")
    # max_or_reset is not associative (a 0 first in a batch's partial would lose its
    # reset), so it is never combined; plain max is, and is
    grouped.reduce(max_or_reset, "maxima").to_stream().to("maxima")
    grouped.reduce(max, "peaks", associative=True).to_stream().to("peaks")
    (grouped.aggregate(list, add_or_reset, "lists", merge=lambda k, agg, part: agg + part)
        .to_stream().to("lists"))


def aggregations_model(sequence: list[Event], rekey: bool, latest: bool = True
                       ) -> dict[str, list[Out]]:
    """A dict per aggregation folded record by record; a ``None`` aggregate deletes
    the key, and the next record starts afresh (from the initializer, or as a
    reduce's first value). Each update is stamped with the largest timestamp of the
    key's records since its last delete (``latest``), or with its record's."""
    tables: dict[str, dict[Any, Any]] = {"counts": {}, "maxima": {}, "lists": {},
                                         "peaks": {}}
    stamps: dict[str, dict[Any, int]] = {name: {} for name in tables}
    out: dict[str, list[Out]] = defaultdict(list)
    for _topic, k, v, ts in sequence:
        key = (k.upper() if k else None) if rekey else k
        if key is None or v is None:
            continue
        counts, maxima, lists = tables["counts"], tables["maxima"], tables["lists"]
        counts[key] = counts.get(key, 0) + 1
        maxima[key] = v if key not in maxima else max_or_reset(maxima[key], v)
        lists[key] = add_or_reset(key, v, lists.get(key, []))
        tables["peaks"][key] = max(tables["peaks"].get(key, v), v)
        for name, table in tables.items():
            stamp = max(stamps[name].get(key, ts), ts) if latest else ts
            out[name].append((key, table[key], stamp))
            if table[key] is None:
                del table[key]
                stamps[name].pop(key, None)
            else:
                stamps[name][key] = stamp
    return out


disordered = st.lists(st.tuples(keys, st.one_of(st.integers(0, 4), st.none()),
                                st.integers(1, 60)), max_size=40).map(
    lambda raw: [("in", k, v, ts) for k, v, ts in raw])
"""Events of one topic whose timestamps go back and forth (in offset order, which one
topic keeps)."""


@FAST
@given(st.one_of(events(["in", "other"], value=st.one_of(st.integers(0, 4), st.none())),
                 disordered), cuts, st.booleans(), st.integers(1, 3), st.booleans())
def test_aggregations_emit_the_model_updates(sequence: list[Event], at: list[int],
                                             rekey: bool, partitions: int,
                                             cache: bool) -> None:
    """count, reduce and aggregate of two merged topics, after group_by (a
    repartition) or group_by_key: without the cache, one update per record with a
    key and a value, each key's updates in the model's order, stamped with the
    largest timestamp of the key's records so far (the inputs' timestamps may go
    back and forth: ``disordered``); with it (combined before the repartition, a
    partial carrying the largest time of its records), the model's updates as of
    batch ends (``assert_coalesced``). An aggregate that becomes ``None`` is a
    delete, and the key's next record starts afresh; the store ends as the model's
    final table. Keys are spread over ``partitions`` by their original key, which
    decides the grouped key, so each grouped key's records stay in order."""
    check_aggregations(sequence, at, rekey, partitions, cache, timestamps="latest")


@FAST
@given(st.one_of(events(["in", "other"], value=st.one_of(st.integers(0, 4), st.none())),
                 disordered), cuts, st.booleans(), st.integers(1, 3), st.booleans())
def test_aggregations_by_default_stamp_updates_with_their_records_time(
        sequence: list[Event], at: list[int], rekey: bool, partitions: int,
        cache: bool) -> None:
    """The same aggregations with the builder's default ``timestamps="record"``: each
    update keeps the timestamp of the record that made it (with the cache, of the
    key's last record of the batch), also when the inputs' timestamps go back."""
    check_aggregations(sequence, at, rekey, partitions, cache, timestamps="record")


def check_aggregations(sequence: list[Event], at: list[int], rekey: bool, partitions: int,
                       cache: bool, *, timestamps: Timestamps) -> None:
    """The aggregations' outputs and final stores equal ``aggregations_model``'s."""
    b = builder(cache, timestamps)
    aggregations(b, rekey)
    driver = run(b.build(), sequence, at, partitions=partitions)
    model = aggregations_model(sequence, rekey, latest=timestamps == "latest")
    for name in ("counts", "maxima", "lists", "peaks"):
        if cache:
            assert_coalesced(outputs(driver, name), model[name])
        else:
            assert per_key(outputs(driver, name)) == per_key(model[name]), name
        last = {k: v for k, v, _ in model[name]}
        final = {k: v for k, v in last.items() if v is not None}
        stored = {}
        for p in range(partitions):
            stored.update(driver.store(name, p).get_many(["a", "b", "c", "A", "B", "C"]))
        assert stored == final


@FAST
@given(st.lists(st.tuples(st.text("xyz", max_size=6), st.integers(0, 3)), max_size=25),
       cuts, st.integers(1, 3), st.booleans())
def test_word_count_over_partitions(lines: list[tuple[str, int]], at: list[int],
                                    partitions: int, cache: bool) -> None:
    """Words of lines in any source partition, counted after a repartition: each
    word's counts go 1, 2, ... n in order (per-key order through the repartition) and
    end at the model's count; with the cache (words combined per batch before the
    repartition), some of 1, 2, ... n, increasing, ending at n."""
    b = builder(cache)
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
    if cache:
        assert {w: c[-1] for w, c in counted.items()} == words
        assert all(c == sorted(set(c)) for c in counted.values())
    else:
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
