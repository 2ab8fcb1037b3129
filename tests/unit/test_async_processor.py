"""``AsyncMessageProcessor`` with no broker: the testing driver and the real
``TopicProcessor`` on the in-memory broker. Calls of a batch overlap up to
``async_concurrency``, one key's stay in order, the turn's steps wait for every call,
and a failure, a timeout or a crash leaves the batch uncommitted (or dead-lettered)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

from kasper_py import (
    AsyncMessageProcessor,
    Config,
    ConfigError,
    Message,
    ProcessingError,
    ProcessorContext,
    Sender,
    TopicProcessor,
)
from kasper_py.exceptions import SimulatedCrash
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message


class Lookup(AsyncMessageProcessor):
    """Sends ``value * 10`` to "out" after ``delays[value]`` seconds (0.01 by default);
    ``value == fail_on`` raises. Notes how many calls overlap and the order per key."""

    delays: ClassVar[dict[int, float]] = {}
    fail_on: ClassVar[int | None] = None
    in_flight = 0
    most_in_flight = 0
    started: ClassVar[list[int]] = []
    finished: ClassVar[list[int]] = []
    cancelled: ClassVar[list[int]] = []

    async def process_message(self, message: Message, sender: Sender) -> None:
        value = json.loads(message.value)
        cls = Lookup  # its subclasses note here too
        cls.started.append(value)
        cls.in_flight += 1
        cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            await asyncio.sleep(cls.delays.get(value, 0.01))
            if value == cls.fail_on:
                raise ValueError(f"lookup of {value} failed")
            sender.send("out", json.dumps(value * 10), key=message.key)
            cls.finished.append(value)
        except asyncio.CancelledError:
            cls.cancelled.append(value)
            raise
        finally:
            cls.in_flight -= 1


@pytest.fixture(autouse=True)
def _fresh_lookup() -> None:
    Lookup.delays, Lookup.fail_on = {}, None
    Lookup.in_flight = Lookup.most_in_flight = 0
    Lookup.started, Lookup.finished, Lookup.cancelled = [], [], []


def config(**kwargs: Any) -> Config:
    return Config(**{"name": "lookup", "bootstrap_servers": "in-memory",
                     "input_topics": ["in"], "batch_size": 100, "key_serde": "str",
                     "value_serde": "str", **kwargs})


def messages(values: list[int], keys: list[str] | None = None) -> list[Message]:
    keys = keys or [f"k{n}" for n in range(len(values))]
    return [make_message("in", json.dumps(v), key=k, offset=n)
            for n, (v, k) in enumerate(zip(values, keys, strict=True))]


def test_calls_of_a_batch_overlap_up_to_the_concurrency() -> None:
    """40 distinct keys at concurrency 8: 8 calls in flight at most and at some point,
    every output sent once."""
    driver = ProcessorDriver(Lookup, config=config(async_concurrency=8))
    driver.process(messages(list(range(40))))
    assert Lookup.most_in_flight == 8
    assert sorted(int(v) for _, v in driver.outputs("out")) == [n * 10 for n in range(40)]
    assert driver.committed == {("in", 0): 40}


def test_one_keys_calls_run_in_offset_order() -> None:
    """Key "a" gets a slow first call and fast later ones; they still finish in offset
    order, while key "b" overlaps them."""
    Lookup.delays = {0: 0.05, 1: 0.0, 2: 0.0}
    driver = ProcessorDriver(Lookup, config=config())
    driver.process(messages([0, 1, 2, 3], ["a", "a", "a", "b"]))
    assert [v for v in Lookup.finished if v < 3] == [0, 1, 2]
    assert Lookup.finished.index(3) < Lookup.finished.index(0)
    assert [v for k, v in driver.outputs("out") if k == "a"] == ["0", "10", "20"]


def test_unordered_calls_of_one_key_overlap() -> None:
    """``key_ordered = False``: one key's calls overlap, the slow first finishes last."""

    class Unordered(Lookup):
        key_ordered = False

    Lookup.delays = {0: 0.05}
    driver = ProcessorDriver(Unordered, config=config())
    driver.process(messages([0, 1, 2], ["a", "a", "a"]))
    assert Lookup.finished[-1] == 0
    assert Lookup.most_in_flight == 3


def test_a_failed_call_cancels_the_rest_and_leaves_the_batch_uncommitted() -> None:
    """A call that raises fails the batch as process() raising does; the slow calls
    still running are cancelled, not left to finish after the turn."""
    Lookup.fail_on = 1
    Lookup.delays = {2: 5.0, 3: 5.0}
    driver = ProcessorDriver(Lookup, config=config())
    with pytest.raises(ProcessingError, match=r"raised ValueError: lookup of 1 failed"):
        driver.process(messages([0, 1, 2, 3]))
    assert sorted(Lookup.cancelled) == [2, 3]
    assert driver.committed == {}
    assert driver.outputs("out") == []


def test_a_batch_past_its_timeout_fails_uncommitted() -> None:
    """``async_timeout``: a batch still running then fails with a TimeoutError naming
    the setting; its calls are cancelled."""
    Lookup.delays = {1: 30.0}
    driver = ProcessorDriver(Lookup, config=config(async_timeout=0.1))
    with pytest.raises(ProcessingError, match=r"TimeoutError: .*async_timeout=0.1s"):
        driver.process(messages([0, 1]))
    assert Lookup.cancelled == [1]
    assert driver.committed == {}


def test_a_poison_message_is_dead_lettered_and_the_rest_goes_through() -> None:
    """``on_process_error="dead_letter"``: the failing call's message goes to the dead
    letter topic with its original bytes; every other message's output is kept once."""
    Lookup.fail_on = 3
    driver = ProcessorDriver(Lookup, config=config(
        on_process_error="dead_letter", dead_letter_topic="dlq"))
    driver.process(messages(list(range(6))))
    assert sorted(int(v) for _, v in driver.outputs("out")) == [0, 10, 20, 40, 50]
    assert driver.outputs("dlq") == [("k3", "3")]
    assert driver.committed == {("in", 0): 6}


def test_exactly_once_in_the_driver() -> None:
    """Under exactly-once the batch's outputs and offsets go in one transaction."""
    driver = ProcessorDriver(Lookup, config=config(processing_guarantee="exactly_once"))
    driver.process(messages([1, 2, 3]))
    assert sorted(driver.outputs("out")) == [("k0", "10"), ("k1", "20"), ("k2", "30")]
    assert driver.committed == {("in", 0): 3}


class Totals(AsyncMessageProcessor):
    """``async def process``: reads the batch's totals with one get_many, then per
    message awaits a lookup, adds to the key's total and sends it; stores and sender are
    used from the coroutines."""

    def __init__(self, context: ProcessorContext) -> None:
        super().__init__(context)
        self.totals = context.store("totals")

    async def process(self, messages: list[Message], sender: Sender) -> None:  # type: ignore[override]
        totals = self.totals.get_many({m.key for m in messages})

        async def add(message: Message) -> None:
            await asyncio.sleep(0.001)
            total = totals.get(message.key, 0) + int(message.value)
            totals[message.key] = total
            sender.send("out", str(total), key=message.key)

        await self.concurrently(messages, add)
        self.totals.put_many(totals)


def test_async_process_of_the_batch_with_a_store() -> None:
    """A batch coroutine (``async def process``) keeps running totals per key in order."""
    driver = ProcessorDriver(Totals, config=config(), stores=[MemoryTable("totals")])
    driver.process([make_message("in", str(n), key="ab"[n % 2], offset=n)
                    for n in range(6)])
    outputs = driver.outputs("out")
    assert [v for k, v in outputs if k == "a"] == ["0", "2", "6"]
    assert [v for k, v in outputs if k == "b"] == ["1", "4", "9"]
    assert driver.store("totals").get_many({"a", "b"}) == {"a": 6, "b": 9}


def broker_with_input(count: int) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    broker.create_topic("out", partitions=2)
    for n in range(count):
        broker.produce("in", json.dumps(n), key=f"k{n % 7}")
    return broker


def run(broker: InMemoryBroker, cfg: Config, on_step: Any = None) -> None:
    clients = broker.clients(cfg)
    if on_step is not None:
        hook = clients.on_step

        def both(step: str) -> None:
            on_step(step)
            hook(step)

        clients.on_step = both
    with TopicProcessor(cfg, Lookup, clients=clients) as processor:
        processor.run_loop(until_caught_up=True)


def test_the_turn_flushes_and_produces_after_every_call_is_done() -> None:
    """On the real loop: when the turn moves past process, no call is in flight and
    every started call has finished; every input has its output."""
    broker = broker_with_input(30)
    seen: list[tuple[int, int]] = []

    def after_process(step: str) -> None:
        if step == "after_process":
            seen.append((Lookup.in_flight, len(Lookup.started) - len(Lookup.finished)))

    run(broker, config(batch_size=10, async_concurrency=4), after_process)
    assert seen and set(seen) == {(0, 0)}
    assert sorted(json.loads(m.value) for m in broker.read("out")) == [
        n * 10 for n in range(30)]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("step", ["after_process", "after_flush", "after_produce"])
def test_a_crash_mid_turn_replays_the_batch(step: str, guarantee: str) -> None:
    """A process killed between two steps of its second turn commits nothing of it; the
    restarted process sends every missing output and commits to the end; under
    exactly-once no output shows twice."""
    broker = broker_with_input(30)
    cfg = config(batch_size=10, name=f"crash-{step.replace('_', '-')}",
                 processing_guarantee=guarantee)
    broker.faults.crash_at(step, turn=2)
    with pytest.raises(SimulatedCrash):
        run(broker, cfg)
    committed = broker.committed(cfg.group)
    assert sum(committed.values()) < 30
    run(broker, cfg)
    outputs = [json.loads(m.value) for m in broker.read("out")]
    assert set(outputs) == {n * 10 for n in range(30)}
    if guarantee == "exactly_once":
        assert sorted(outputs) == [n * 10 for n in range(30)]
    assert broker.committed(cfg.group) == {
        ("in", p): broker.watermarks("in", p)[1] for p in (0, 1)}


def test_a_failing_call_on_the_loop_leaves_the_offsets_where_they_were() -> None:
    """The real loop stops with the ProcessingError; nothing of the batch committed."""
    broker = broker_with_input(5)
    Lookup.fail_on = 4
    cfg = config()
    with pytest.raises(ProcessingError, match="lookup of 4 failed"):
        run(broker, cfg)
    assert broker.committed(cfg.group) in ({}, {("in", 0): 0, ("in", 1): 0})


@pytest.mark.parametrize(("field", "value", "text"), [
    ("async_concurrency", 0, "must be a positive int"),
    ("async_concurrency", True, "must be a positive int"),
    ("async_timeout", 0, "must be a positive, finite number"),
    ("async_timeout", float("inf"), "must be a positive, finite number"),
])
def test_bad_async_settings(field: str, value: object, text: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}.*{text}"):
        config(**{field: value})


def test_a_processor_with_no_message_handler_says_so() -> None:
    class Empty(AsyncMessageProcessor):
        pass

    driver = ProcessorDriver(Empty, config=config())
    with pytest.raises(ProcessingError, match="defines neither process_message"):
        driver.process(messages([1]))
