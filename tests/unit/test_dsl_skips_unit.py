"""Records the DSL's windowed join and windowed aggregation cannot take (a ``None`` key
or value, skipped as Kafka Streams skips them) are counted in
``kasper_messages_skipped_total`` with their reason, through the real loop on the
in-memory broker: never dropped silently."""

from __future__ import annotations

import json
from typing import Any

from kasper_py import Config, ProcessorContext, TopicProcessor
from kasper_py.dsl import Builder
from kasper_py.dsl._ops import NullSkips, Op
from kasper_py.dsl._tables import KeyedLookupJoin
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.testing import InMemoryBroker
from kasper_py.windows import JoinWindows, Tumbling


def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


def run(builder: Builder, produced: list[tuple[str, bytes | None, bytes | None]]
        ) -> tuple[InMemoryBroker, PrometheusObserver]:
    """``builder``'s app run to the end over ``produced`` (topic, key, value), each a
    millisecond after the last, with a Prometheus observer."""
    app = builder.build()
    broker = InMemoryBroker()
    for topic in {*app.sources, *(t for t, _, _ in produced), "out"}:
        broker.create_topic(topic)
    for at, (topic, key, value) in enumerate(produced, start=100):
        broker.produce(topic, value, key, timestamp=at)
    config = Config(name="skips", bootstrap_servers="memory", input_topics=app.sources,
                    key_serde="json", value_serde="json")
    observer = PrometheusObserver(config)
    processor = TopicProcessor(config, app, clients=broker.clients(config), observer=observer)
    processor.run_loop(until_caught_up=True)
    processor.close()
    return broker, observer


def skipped(observer: PrometheusObserver, reason: str) -> float | None:
    return observer.registry.get_sample_value("kasper_messages_skipped_total", {
        "processor": "skips", "topic": "", "partition": "0", "policy": "skip",
        "reason": reason})


def test_a_windowed_join_counts_the_records_with_no_key_or_no_value_it_skips() -> None:
    """Of an inner join's inputs, two keyless records and one with a ``null`` value are
    skipped and counted by reason; the others join as before."""
    b = Builder("skips", stores="memory")
    b.stream("l").join(b.stream("r"), pair, JoinWindows(1), store="pairs").to("out")
    broker, observer = run(b, [("l", b'"k"', b'"L"'), ("l", None, b'"L-keyless"'),
                               ("r", None, b'"R-keyless"'), ("r", b'"k"', b"null"),
                               ("r", b'"k"', b'"R"')])
    assert [(json.loads(m.key or b""), json.loads(m.value or b""))
            for m in broker.read("out")] == [("k", ["L", "R"])]
    assert skipped(observer, "null_key") == 2
    assert skipped(observer, "null_value") == 1


def test_a_windowed_count_counts_the_records_with_no_key_or_no_value_it_skips() -> None:
    """A windowed count skips (and counts) a keyless record and a ``null`` value; the
    others are counted in their window."""
    b = Builder("skips", stores="memory")
    (b.stream("l").group_by_key().windowed_by(Tumbling(1)).count("counts")
        .to_stream().to("out"))
    broker, observer = run(b, [("l", b'"a"', b'"x"'), ("l", None, b'"x"'),
                               ("l", b'"a"', b"null"), ("l", b'"a"', b'"y"')])
    assert json.loads(broker.read("out")[-1].value or b"") == 2
    assert skipped(observer, "null_key") == 1
    assert skipped(observer, "null_value") == 1


def by_value(_key: Any, value: Any) -> Any:
    """The value's ``to`` as the record's new key (``None`` when it says so; ``"a"``
    for a ``null`` value, which the aggregation then skips)."""
    return value["to"] if value is not None else "a"


def test_a_regrouped_count_counts_the_records_it_cannot_group_or_count() -> None:
    """A ``group_by`` to a ``None`` key cannot be repartitioned and a ``null`` value
    cannot be counted: both skipped and counted, with the combined repartition (the
    cache on) and without it (cache off: the repartition sink and the count skip)."""
    for cache in (True, False):
        b = Builder("skips", stores="memory")
        (b.stream("l").group_by(by_value).count("counts", cache=cache)
            .to_stream().to("out"))
        broker, observer = run(b, [("l", b'"k"', b'{"to": "a"}'), ("l", b'"k"', b'{"to": null}'),
                                   ("l", b'"k"', b"null"), ("l", b'"k"', b'{"to": "a"}')])
        counts = [(json.loads(m.key or b""), json.loads(m.value or b""))
                  for m in broker.read("out")]
        assert counts[-1] == ("a", 2), cache
        assert skipped(observer, "null_key") == 1, cache
        assert skipped(observer, "null_value") == 1, cache


def test_a_stream_table_join_counts_the_records_it_cannot_join() -> None:
    """A stream record with no key or a ``null`` value joins nothing, even a left join:
    skipped and counted; the others join the table as before."""
    b = Builder("skips", stores="memory")
    b.stream("l").left_join(b.table("t"), pair).to("out")
    broker, observer = run(b, [("t", b'"k"', b'"T"'), ("l", b'"k"', b'"L"'),
                               ("l", None, b'"keyless"'), ("l", b'"k"', b"null"),
                               ("l", b'"z"', b'"Z"')])
    assert [(json.loads(m.key or b""), json.loads(m.value or b""))
            for m in broker.read("out")] == [("k", ["L", "T"]), ("z", ["Z", None])]
    assert skipped(observer, "null_key") == 1
    assert skipped(observer, "null_value") == 1


class Lookups:
    """A global table's contents, as ``KeyedLookupJoin`` reads them (``get_many``)."""

    def __init__(self, rows: dict[Any, Any]) -> None:
        self.rows = rows

    def get_many(self, keys: Any) -> dict[Any, Any]:
        return {k: self.rows[k] for k in keys if k in self.rows}


class Collect(Op):
    """The records an operator emits."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Any] = []

    def push(self, records: Any) -> None:
        self.records += records


def test_a_global_table_join_counts_the_null_values_it_skips() -> None:
    """A global-table join looks up by ``key_of(key, value)``, so a keyless record still
    joins; a ``null`` value is skipped and counted."""
    out, observer = lookup_join(False, [(None, {"to": "a"}, 1, ()), ("k", None, 2, ()),
                                        ("k", {"to": "b"}, 3, ())])
    assert out.records == [(None, [{"to": "a"}, "A"], 1, ())]
    assert skipped(observer, "null_key") is None
    assert skipped(observer, "null_value") == 1


def lookup_join(left: bool, records: list[Any]) -> tuple[Collect, PrometheusObserver]:
    """What a global-table join (``left`` or inner, its table holding ``a``: ``A``,
    looked up by ``by_value``) emits of ``records``, and its observer."""
    config = Config(name="skips", bootstrap_servers="memory", input_topics=["l"])
    observer = PrometheusObserver(config)
    join = KeyedLookupJoin(Lookups({"a": "A"}), by_value, pair, left,  # type: ignore[arg-type]
                           NullSkips(ProcessorContext(0, config, observer=observer)))
    out = Collect()
    join.children.append(out)
    join.push(records)
    return out, observer


NO_LOOKUP_KEY = [("k1", {"to": None}, 1, ()), ("k2", {"to": "a"}, 2, ()),
                 ("k3", {"to": None}, 3, ())]
"""Two records whose ``key_of`` is ``None`` and one that finds its row."""


def test_an_inner_global_table_join_counts_the_records_whose_lookup_key_is_none() -> None:
    """``key_of`` gave ``None``: nothing to look up, so the inner join skips the record,
    counted as a ``null_key`` skip, never silently."""
    out, observer = lookup_join(False, NO_LOOKUP_KEY)
    assert out.records == [("k2", [{"to": "a"}, "A"], 2, ())]
    assert skipped(observer, "null_key") == 2


def test_a_left_global_table_join_emits_the_records_whose_lookup_key_is_none() -> None:
    out, observer = lookup_join(True, NO_LOOKUP_KEY)
    assert out.records == [("k1", [{"to": None}, None], 1, ()),
                           ("k2", [{"to": "a"}, "A"], 2, ()), ("k3", [{"to": None}, None], 3, ())]
    assert skipped(observer, "null_key") is None
