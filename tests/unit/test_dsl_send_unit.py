"""What the streams DSL hands the ``Sender``: a batch's records for a topic or a
repartition in one ``send_encoded`` / ``send_many`` / ``repartition_many`` (packed:
``repartition_packed``) call, in order, with their keys, timestamps and headers; and a
record the serde refuses fails the turn uncommitted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kasper_py import Message, Sender, SerdeError
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.sender import SendRecord
from kasper_py.testing import ProcessorDriver, make_message

Call = tuple[str, str, list[SendRecord]]
"""(method, topic or repartition name, records) of one call the Sender received."""


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Every ``send``, ``send_many``, ``send_encoded``, ``repartition``,
    ``repartition_many`` and ``repartition_packed`` call the Sender received, in order;
    each still does what it does."""
    received: list[Call] = []

    def recording(method: str) -> Any:
        real = getattr(Sender, method)

        def record(self: Sender, target: str, *args: Any, **kwargs: Any) -> None:
            many = method.endswith(("_many", "_packed", "_encoded"))
            received.append((method, target, list(args[0]) if many else [args]))
            real(self, target, *args, **kwargs)

        return record

    for method in ("send", "send_many", "send_encoded", "repartition", "repartition_many",
                   "repartition_packed"):
        monkeypatch.setattr(Sender, method, recording(method))
    yield received


def keep(_key: Any, value: Any) -> bool:
    return value % 3 != 0


def chain(*, to: tuple[str, ...] = ("out",), cache: bool = True) -> App:
    """``stream("in").filter(keep).map_values(+100).to(each of to)``."""
    builder = Builder("sends", stores="memory", cache=cache)
    mapped = builder.stream("in").filter(keep).map_values(lambda v: v + 100)
    for topic in to:
        mapped.to(topic)
    return builder.build()


def driver_of(app: App, partitions: int = 1) -> ProcessorDriver:
    return ProcessorDriver(app, key_serde="json", value_serde="json", partitions=partitions)


def batch(n: int, partition: int = 0, keys: str = "k") -> list[Message]:
    return [make_message("in", i, f"{keys}{i % 7}", partition=partition, offset=i,
                         timestamp=1_000 + i, headers=(("n", b"%d" % i),)) for i in range(n)]


def decoded(driver: ProcessorDriver, topic: str) -> list[tuple[Any, Any, int | None, Any]]:
    """What the app sent to ``topic``: (key, value, timestamp, headers), decoded."""
    def decode(raw: bytes | None) -> Any:
        return None if raw is None else json.loads(raw)

    return [(decode(m.key), decode(m.value), m.timestamp, m.headers)
            for m in driver.sent if m.topic == topic]


def test_a_chain_sends_a_batch_to_its_topic_in_one_call_in_order(calls: list[Call]) -> None:
    """N records with headers through ``filter → map_values → to``: the producer's
    records made in the chain's pass, one ``send_encoded`` for the batch, no ``send``;
    the outputs exact, in order, with their keys, timestamps and headers."""
    driver = driver_of(chain())
    driver.process(batch(1_000))
    expected = [(f"k{i % 7}", i + 100, 1_000 + i, (("n", b"%d" % i),))
                for i in range(1_000) if i % 3]
    assert [(method, target, len(records)) for method, target, records in calls] == [
        ("send_encoded", "out", len(expected))]
    assert decoded(driver, "out") == expected
    assert driver.committed == {("in", 0): 1_000}


def test_one_call_per_output_topic_and_partition_in_a_turn(calls: list[Call]) -> None:
    """Two partitions' batches in one turn, a chain to two topics: one call per topic
    and partition, each input partition's outputs (keys ``p0-…``, ``p1-…``) exact and
    in its order."""
    driver = driver_of(chain(to=("out", "copy")), partitions=2)
    driver.process(batch(300, partition=0, keys="p0-") + batch(200, partition=1, keys="p1-"))
    assert sorted((method, target, len(records)) for method, target, records in calls) == [
        ("send_many", "copy", 133), ("send_many", "copy", 200),
        ("send_many", "out", 133), ("send_many", "out", 200)]
    for topic in ("out", "copy"):
        for partition, n in ((0, 300), (1, 200)):
            keys = f"p{partition}-"
            assert [(key, value, timestamp) for key, value, timestamp, _ in decoded(driver, topic)
                    if key.startswith(keys)] == [
                (f"{keys}{i % 7}", i + 100, 1_000 + i) for i in range(n) if i % 3]


def test_repartitions_get_a_batch_in_one_call(calls: list[Call]) -> None:
    """A re-keyed count sends its batch to the repartition in one call: each record
    (``cache=False``), or one combined record per key (the cache); the counts exact."""
    for cache, sent in ((False, 1_000), (True, 7)):
        calls.clear()
        builder = Builder("sends", stores="memory", cache=cache)
        (builder.stream("in").group_by(lambda k, _v: k.upper()).count("counts")
            .to_stream().to("counts"))
        driver = driver_of(builder.build())
        driver.process(batch(1_000))
        assert [(method, target, len(records)) for method, target, records in calls
                if method.startswith("repartition")] == [
            ("repartition_packed", "counts-by-key", sent)]
        last = {key: value for key, value, _, _ in decoded(driver, "counts")}
        assert last == {f"K{j}": len(range(j, 1_000, 7)) for j in range(7)}


def test_a_value_the_serde_refuses_fails_the_turn_uncommitted() -> None:
    """A value JSON cannot encode: ``SerdeError`` naming the topic, nothing of the
    batch sent, the committed offset where the last good turn left it."""
    builder = Builder("sends", stores="memory")
    builder.stream("in").map_values(lambda v: v if v < 5 else {v}).to("out")
    driver = driver_of(builder.build())
    driver.process(batch(5))
    assert driver.committed == {("in", 0): 5}
    sent = list(driver.sent)
    with pytest.raises(SerdeError, match="cannot encode message for topic 'out'"):
        driver.process([make_message("in", v, "k", offset=v, timestamp=1_000 + v)
                        for v in range(5, 10)])
    assert driver.committed == {("in", 0): 5}
    assert driver.sent == sent


def test_a_foreign_key_join_sends_each_batch_of_requests_in_one_call(
        calls: list[Call]) -> None:
    """The foreign-key join's subscriptions, answers and updates for a batch cross each
    repartition in one call, in the order of the records that caused them."""
    builder = Builder("sends", stores="memory")
    orders, customers = builder.table("orders"), builder.table("customers")
    orders.join_foreign(customers, lambda o: o["c"], lambda o, c: [o["n"], c and c["name"]],
                        name="enriched").to_stream().to("out")
    driver = driver_of(builder.build())
    driver.process([make_message("orders", {"c": f"c{i % 3}", "n": i}, f"o{i}", offset=i,
                                 timestamp=10 + i) for i in range(20)])
    driver.process([make_message("customers", {"name": f"N{i}"}, f"c{i}", offset=i,
                                 timestamp=100 + i) for i in range(3)])
    assert [(method, target, [key for key, *_ in records])
            for method, target, records in calls if method.startswith("repartition")] == [
        ("repartition_packed", "enriched-subscription", [f"c{i % 3}" for i in range(20)]),
        ("repartition_packed", "enriched-response", [f"o{i}" for i in range(20)]),
        ("repartition_packed", "enriched-response",
         [f"o{i}" for c in range(3) for i in range(c, 20, 3)])]
    assert {key: value for key, value, _, _ in decoded(driver, "out")} == {
        f"o{i}": [i, f"N{i % 3}"] for i in range(20)}
