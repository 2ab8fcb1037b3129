"""``Deduplicator`` against a model: random ids and event times (out of order too),
batches cut at random points, restarts on a fresh state_dir that restore the table from
its changelog, under both guarantees; the records that pass are exactly the model's."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs
from kasper_py.windows import Deduplicator

WITHIN_MS = 10_000
Event = tuple[str, int]

EVENTS = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40).map(lambda s: s * 1000)),
                  max_size=40)
CUTS = st.lists(st.sampled_from(["cut", "restart"]), max_size=40)


class Dedup(MessageProcessor):
    """Sends each message that is its id's first occurrence within 10 s to "out"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.dedup = Deduplicator(context, "seen", within=WITHIN_MS / 1000)

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in self.dedup.first_occurrences(messages, lambda m: m.value,
                                                    lambda m: m.timestamp):
            sender.send("out", f"{message.value}@{message.timestamp}")


def model(events: list[Event]) -> list[str]:
    """The rule, spelt out: an id's last passed time is held until stream time reaches
    it plus the window; a record before that time plus the window is dropped."""
    stream_time, held, passed = -1, {}, []
    for key, timestamp in events:
        stream_time = max(stream_time, timestamp)
        first = held.get(key)
        if first is not None and first + WITHIN_MS > stream_time and timestamp < first + WITHIN_MS:
            continue
        held[key] = timestamp
        passed.append(f"{key}@{timestamp}")
    return passed


def _driver(folder: Path, guarantee: str, changelogs: MemoryChangelogs | None,
            memory: bool = False) -> ProcessorDriver:
    config = Config(name="d", bootstrap_servers="unused:9092", input_topics=["in"],
                    value_serde="str", state_dir=str(folder),
                    processing_guarantee=guarantee)  # type: ignore[arg-type]
    table = (MemoryTable("seen") if memory else
             RocksDBTable("seen", key_serde="bytes", value_serde="bytes"))
    return ProcessorDriver(Dedup, config=config, stores=[table], changelogs=changelogs)


def _run(events: list[Event], cuts: list[str], guarantee: str) -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        driver, sent, restarts = _driver(Path(folder) / "0", guarantee, None), [], 0
        batches: list[list[Event]] = [[]]
        for index, event in enumerate(events):
            batches[-1].append(event)
            if index < len(cuts) and cuts[index] == "cut":
                batches.append([])
        for index, batch in enumerate(batches):
            driver.process([make_message("in", key, timestamp=ts) for key, ts in batch])
            if index < len(cuts) and cuts[index] == "restart":
                sent += [value for _, value in driver.outputs("out")]
                driver.close()
                restarts += 1
                driver = _driver(Path(folder) / str(restarts), guarantee, driver.changelogs)
        sent += [value for _, value in driver.outputs("out")]
        driver.close()
        return sent


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS, cuts=CUTS)
def test_the_first_occurrence_of_each_id_passes_exactly(events: list[Event], cuts: list[str],
                                                        guarantee: str) -> None:
    """Whatever the batch cuts and restores, the passing records are the model's."""
    assert _run(events, cuts, guarantee) == model(events)


def test_a_repeat_after_the_window_passes_again_and_out_of_order_repeats_drop() -> None:
    """a@0 passes; a@5 s and an out-of-order a@0 again drop; a@10 s is past the window
    and passes; b@20 s moves stream time so a@15 s (a's occurrence at 10 s, held until
    20 s) is forgotten and passes."""
    events = [("a", 0), ("a", 5000), ("a", 0), ("a", 10_000), ("b", 20_000), ("a", 15_000)]
    assert _run(events, [], "at_least_once") == ["a@0", "a@10000", "b@20000", "a@15000"]
    assert model(events) == ["a@0", "a@10000", "b@20000", "a@15000"]


def test_the_store_keeps_one_entry_per_held_id(tmp_path: Path) -> None:
    """Forgotten occurrences leave the store: after stream time passes every window only
    the latest id's entry (and stream time) remain."""
    driver = _driver(tmp_path, "at_least_once", None, memory=True)
    driver.process([make_message("in", key, timestamp=ts)
                    for key, ts in [("a", 0), ("b", 1000), ("a", 2000), ("c", 60_000)]])
    entries = [key for key, _ in driver.store("seen").items()]
    assert sorted(entries) == [b"d" + b"c" + (60_000).to_bytes(8, "big") + bytes(8), b"m"]
    driver.close()


def test_within_must_be_positive() -> None:
    """within=0 is a ValueError naming it."""
    driver = ProcessorDriver(lambda c: Deduplicator(c, "seen", within=0),  # type: ignore[arg-type,return-value]
                             config=Config(name="d", bootstrap_servers="x:1",
                                           input_topics=["in"]),
                             stores=[MemoryTable("seen")])
    with pytest.raises(ValueError, match=r"deduplication window \(within\) must be more than 0"):
        driver.processor()
