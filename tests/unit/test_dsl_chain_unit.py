"""A stateless chain run as one pass over the batch: a chain reading a topic and ending
in ``to`` makes the producer's records at once (``Sender.send_encoded``), and every
chain gives the outputs, timestamps, order and offsets a record-at-a-time run gives; a
step that raises fails the turn uncommitted, naming its operator and the record."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from kasper_py import Config, Message, ProcessingError, Sender, SerdeError, TopicError
from kasper_py.dsl import Builder
from kasper_py.testing import ProcessorDriver, make_message

Sent = tuple[Any, Any, "int | None", Any]
"""(key, value, timestamp, headers) of an output, key and value decoded."""


def driver_of(builder: Builder, **config: Any) -> ProcessorDriver:
    base = Config(name="chains", bootstrap_servers="in-memory:0", input_topics=("in",),
                  key_serde="json", value_serde="json", **config)
    return ProcessorDriver(builder.build(), config=base)


def numbers(n: int, *, first: int = 0, timestamp: Callable[[int], int | None] = lambda i: 500 + i,
            headers: bool = False) -> list[Message]:
    return [make_message("in", i, f"k{i % 5}", offset=i, timestamp=timestamp(i),
                         headers=(("n", b"%d" % i),) if headers else ())
            for i in range(first, first + n)]


def sent(driver: ProcessorDriver, topic: str = "out") -> list[Sent]:
    def decode(raw: bytes | None) -> Any:
        return None if raw is None else json.loads(raw)

    return [(decode(m.key), decode(m.value), m.timestamp, m.headers)
            for m in driver.sent if m.topic == topic]


def encoded_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of records of each ``send_encoded`` call, recorded as it goes."""
    calls: list[int] = []
    real = Sender.send_encoded

    def record(self: Sender, topic: str, records: list[Any]) -> None:
        calls.append(len(records))
        real(self, topic, records)

    monkeypatch.setattr(Sender, "send_encoded", record)
    return calls


@pytest.mark.parametrize("timestamps", ["record", "latest"])
@pytest.mark.parametrize("headers", [False, True])
def test_filter_map_values_to_sends_each_kept_record_in_order(
        monkeypatch: pytest.MonkeyPatch, timestamps: str, headers: bool) -> None:
    """``filter → map_values → to`` over a batch: each kept record once, in order, with
    its key, mapped value, timestamp and headers, in either timestamps mode; with
    headers or without, the batch goes to the Sender in one ``send_encoded`` call."""
    calls = encoded_calls(monkeypatch)
    builder = Builder("chains", stores="memory", timestamps=timestamps)  # type: ignore[arg-type]
    builder.stream("in").filter(lambda _k, v: v % 3 != 0).map_values(lambda v: v * 10).to("out")
    driver = driver_of(builder)
    driver.process(numbers(100, headers=headers))
    assert sent(driver) == [(f"k{i % 5}", i * 10, 500 + i, (("n", b"%d" % i),) if headers
                             else None) for i in range(100) if i % 3]
    assert calls == [66]
    assert driver.committed == {("in", 0): 100}


def test_a_record_without_a_timestamp_inherits_the_batchs() -> None:
    """A message without a timestamp gives its output the batch's time (the newest event
    time of the batch), as ``send`` would; the others keep their own."""
    builder = Builder("chains", stores="memory")
    builder.stream("in").map_values(lambda v: v + 1).to("out")
    driver = driver_of(builder)
    driver.process(numbers(4, timestamp=lambda i: None if i == 1 else 700 + i))
    assert [(value, stamp) for _, value, stamp, _ in sent(driver)] == [
        (1, 700), (2, 703), (3, 702), (4, 703)]


def test_a_chain_that_drops_every_record_sends_nothing_and_commits() -> None:
    """A filter no record passes: nothing sent, the batch's offsets committed."""
    builder = Builder("chains", stores="memory")
    builder.stream("in").filter(lambda _k, _v: False).map_values(str).to("out")
    driver = driver_of(builder)
    driver.process(numbers(50))
    assert driver.sent == [] and driver.committed == {("in", 0): 50}


def test_flat_map_to_zero_and_to_many_records() -> None:
    """``flat_map`` giving no record for some inputs and several for others: each output
    in the order a record-at-a-time run gives, with its input's timestamp."""
    builder = Builder("chains", stores="memory")
    (builder.stream("in").flat_map(lambda k, v: [(f"{k}-{j}", v) for j in range(v % 3)])
        .flat_map_values(lambda v: [v] * (v % 2 + 1)).to("out"))
    driver = driver_of(builder)
    driver.process(numbers(12))
    assert [(key, value, stamp) for key, value, stamp, _ in sent(driver)] == [
        (f"k{i % 5}-{j}", i, 500 + i)
        for i in range(12) for j in range(i % 3) for _ in range(i % 2 + 1)]


def test_str_keys_and_none_values_go_through_their_serdes() -> None:
    """A chain's str keys and values are encoded by the topic's serdes column by
    column; a ``None`` value stays a tombstone."""
    builder = Builder("chains", stores="memory")
    (builder.stream("in").select_key(lambda k, _v: k.upper())
        .map_values(lambda v: None if v == 2 else f"v{v}").to("out"))
    driver = driver_of(builder)
    driver.process(numbers(4))
    assert [(m.key, m.value) for m in driver.sent] == [
        (b'"K0"', b'"v0"'), (b'"K1"', b'"v1"'), (b'"K2"', None), (b'"K3"', b'"v3"')]


def test_a_key_change_then_a_repartition_counts_by_the_new_key() -> None:
    """``select_key`` (one key ``None``: skipped, counted) then ``group_by_key().count()``
    through the repartition: each new key's count exact."""
    builder = Builder("chains", stores="memory")
    (builder.stream("in").filter(lambda _k, v: v != 7)
        .select_key(lambda _k, v: None if v == 3 else f"p{v % 2}").group_by_key()
        .count("counts").to_stream().to("out"))
    driver = driver_of(builder)
    driver.process(numbers(10))
    driver.process([])  # the repartition's records, read back
    last = {key: value for key, value, _, _ in sent(driver)}
    assert last == {"p0": 5, "p1": 3}
    assert driver.committed[("in", 0)] == 10


def failing(fails_at: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value == fails_at:
            raise ValueError(f"no {value}")
        return value
    return check


@pytest.mark.parametrize("headers", [False, True])
def test_a_step_that_raises_fails_the_turn_naming_the_operator_and_record(
        headers: bool) -> None:
    """A user function raising in the middle of a chain: ``ProcessingError`` naming the
    operator and the record's topic, partition and offset; nothing of the turn sent,
    the offset committed before it unmoved."""
    builder = Builder("chains", stores="memory")
    (builder.stream("in").filter(lambda _k, _v: True)
        .map_values(failing(13), name="checked").to("out"))
    driver = driver_of(builder)
    driver.process(numbers(10, headers=headers))
    before = list(driver.sent)
    with pytest.raises(ProcessingError, match="no 13") as info:
        driver.process(numbers(10, first=10, headers=headers))
    assert "in operator checked, on the record of topic 'in' partition 0 offset 13" in str(
        info.value)
    assert driver.sent == before and driver.committed == {("in", 0): 10}


def test_a_step_after_a_table_that_raises_names_its_operator() -> None:
    """A chain below an aggregation (records, not messages) names the operator too."""
    builder = Builder("chains", stores="memory")
    (builder.stream("in").group_by_key().count("counts").to_stream()
        .map_values(failing(2), name="after-count").to("out"))
    driver = driver_of(builder)
    with pytest.raises(ProcessingError, match=r"no 2.*in operator after-count"):
        driver.process(numbers(10))
    assert driver.sent == [] and driver.committed == {}


def test_the_dead_letter_policy_takes_the_record_a_step_fails_on() -> None:
    """``on_process_error="dead_letter"``: the record the chain fails on goes to the
    dead-letter topic with its offset; every other record's output is sent once, in
    order; the batch is committed."""
    builder = Builder("chains", stores="memory")
    builder.stream("in").map_values(failing(4)).to("out")
    driver = driver_of(builder, on_process_error="dead_letter", dead_letter_topic="dead")
    driver.process(numbers(8))
    assert [value for _, value, _, _ in sent(driver)] == [0, 1, 2, 3, 5, 6, 7]
    (letter,) = [m for m in driver.sent if m.topic == "dead"]
    assert letter.headers is not None
    assert dict(letter.headers)["kasper.source.offset"] == b"4"
    assert driver.committed == {("in", 0): 8}


def outputs_of(chain: Callable[[Any], Any], batches: Iterable[list[Message]]) -> list[Sent]:
    builder = Builder("chains", stores="memory")
    chain(builder.stream("in")).to("out")
    driver = driver_of(builder)
    for batch in batches:
        driver.process(batch)
    return sent(driver)


def test_every_step_kind_fused_equals_a_record_at_a_time_run() -> None:
    """Every stateless step in one chain: the outputs of one batch equal those of the
    records pushed one by one (a batch each), peeks seeing each record once."""
    seen: list[tuple[Any, Any]] = []

    def chain(stream: Any) -> Any:
        return (stream.filter_not(lambda _k, v: v % 4 == 0)
                .map(lambda k, v: (v, k)).peek(lambda k, v: seen.append((k, v)))
                .flat_map_values(lambda v: [v, v + "!"]).select_key(lambda k, _v: k * 2)
                .map_values(len))

    whole = outputs_of(chain, [numbers(20)])
    assert outputs_of(chain, [[m] for m in numbers(20)]) == whole
    assert len(whole) == 2 * 15 and seen[:15] == seen[15:]


def test_a_branch_routes_each_record_to_its_first_holding_predicate_in_order() -> None:
    """``branch`` of three predicates: each record in the first whose predicate holds
    (none: dropped), each branch's outputs in order; a predicate raising names the
    branch."""
    builder = Builder("chains", stores="memory")
    low, middle, odd = builder.stream("in").branch(
        lambda _k, v: v < 3, lambda _k, v: v < 6, lambda _k, v: v % 2 == 1, name="split")
    low.to("low")
    middle.map_values(lambda v: -v).to("middle")
    odd.to("odd")
    driver = driver_of(builder)
    driver.process(numbers(10))
    assert [[value for _, value, _, _ in sent(driver, topic)]
            for topic in ("low", "middle", "odd")] == [[0, 1, 2], [-3, -4, -5], [7, 9]]
    with pytest.raises(ProcessingError, match="in operator split"):
        driver.process([make_message("in", None, "k", offset=10, timestamp=1)])
    assert driver.committed == {("in", 0): 10}


def test_messages_with_and_without_headers_in_one_batch_keep_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch where only some messages carry headers (one a ``None`` value): each
    output has its own message's headers or none, in order, from one pass
    (``send_encoded`` once)."""
    calls = encoded_calls(monkeypatch)
    builder = Builder("chains", stores="memory")
    builder.stream("in").filter(lambda _k, v: v != 4).map_values(lambda v: -v).to("out")
    driver = driver_of(builder)
    marked = {1: (("n", b"1"),), 3: (("a", b"x"), ("b", None)), 4: (("gone", b"4"),)}
    batch = [make_message("in", i, f"k{i}", offset=i, timestamp=900 + i,
                          headers=marked.get(i, ())) for i in range(6)]
    driver.process(batch)
    assert sent(driver) == [(f"k{i}", -i, 900 + i, marked.get(i)) for i in range(6) if i != 4]
    assert calls == [5]


def test_a_message_of_a_topic_the_chain_does_not_read_fails_the_turn() -> None:
    """A stray message in the middle of a chain app's batch (its ends of the chain's
    topic): ``TopicError`` naming the stray topic, nothing sent, nothing committed:
    never passed through the chain as one of its topic's."""
    builder = Builder("chains", stores="memory")
    builder.stream("in").map_values(lambda v: v + 1).to("out")
    driver = driver_of(builder)
    stray = make_message("elsewhere", 7, "k", offset=0, timestamp=5)
    first, last = numbers(2)
    with pytest.raises(TopicError, match="'elsewhere', which no processor of the app reads"):
        driver.process([first, stray, last])
    assert driver.sent == [] and driver.committed == {}


def test_a_value_the_topics_serde_refuses_names_the_topic_with_headers_too() -> None:
    """A chain to a topic whose serde cannot encode a mapped value (a set, JSON):
    ``SerdeError`` naming the topic, with and without headers; nothing sent or
    committed."""
    builder = Builder("chains", stores="memory")
    builder.stream("in").map_values(lambda v: {v} if v == 3 else v).to("out")
    for headers in (False, True):
        driver = driver_of(builder)
        with pytest.raises(SerdeError, match="cannot encode message for topic 'out'"):
            driver.process(numbers(5, headers=headers))
        assert driver.sent == [] and driver.committed == {}
