"""Windowed tables against a brute-force model, with hypothesis: out-of-order records,
late ones dropped and counted, batches split at random points, for every window kind
and both emit modes. The model keeps every record and recomputes each window from
them; the table keeps aggregates in a store and expires closed windows."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.observability.observe import NoopStoreObserver
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.windows import (
    Hopping,
    Session,
    Sliding,
    Tumbling,
    WindowedTable,
    WindowKind,
    count,
    sum_of,
)
from kasper_py.windows.table import Emit

Window = tuple[str, int, int]


class LateCounter(NoopStoreObserver):
    """A store observer keeping the late records reported."""

    def __init__(self) -> None:
        self.late = 0

    def on_late_records(self, store: str, count: int) -> None:
        self.late += count


class Windowed(MessageProcessor):
    """Sums values per key and window; keeps every batch's results."""

    def __init__(self, context: ProcessorContext, kind: WindowKind, emit: Emit) -> None:
        self.table = WindowedTable(context, "windows", kind, sum_of(), emit=emit)
        self.batches: list[list[Any]] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.batches.append(self.table.update((m.key, m.timestamp, m.value) for m in messages))


@dataclass
class Model:
    """Every record kept; windows recomputed from the accepted ones."""

    kind: WindowKind
    stream_time: int = -1
    late: int = 0
    accepted: list[tuple[str, int, int, int]] = field(default_factory=list)
    """(key, timestamp, value, stream time when it arrived)."""
    sessions: dict[str, list[list[int]]] = field(default_factory=dict)

    def add(self, key: str, timestamp: int, value: int) -> None:
        self.stream_time = max(self.stream_time, timestamp)
        if isinstance(self.kind, Session):
            self._add_session(key, timestamp, value)
        elif isinstance(self.kind, Sliding):
            if self.stream_time < timestamp + 1 + self.kind.grace_ms:
                self.accepted.append((key, timestamp, value, self.stream_time))
            else:
                self.late += 1
        else:
            spans = self.fixed_windows(timestamp)
            if any(self.stream_time >= end + self.kind.grace_ms for _, end in spans):
                self.late += 1
            self.accepted.append((key, timestamp, value, self.stream_time))

    def fixed_windows(self, timestamp: int) -> list[tuple[int, int]]:
        if isinstance(self.kind, Tumbling):
            size = advance = self.kind.size_ms
        else:
            assert isinstance(self.kind, Hopping)
            size, advance = self.kind.size_ms, self.kind.advance_ms
        return [(k * advance, k * advance + size) for k in range(timestamp // advance + 1)
                if k * advance <= timestamp < k * advance + size]

    def _add_session(self, key: str, timestamp: int, value: int) -> None:
        assert isinstance(self.kind, Session)
        gap, grace = self.kind.gap_ms, self.kind.grace_ms
        sessions = self.sessions.setdefault(key, [])
        touching = [s for s in sessions if s[0] - gap <= timestamp <= s[1] + gap]
        closed = [s for s in touching if self.stream_time >= s[1] + 1 + gap + grace]
        if self.stream_time >= timestamp + 1 + gap + grace or closed:
            self.late += 1
            return
        for s in touching:
            sessions.remove(s)
        sessions.append([min([timestamp, *(s[0] for s in touching)]),
                         max([timestamp, *(s[1] for s in touching)]),
                         value + sum(s[2] for s in touching)])

    def windows(self) -> dict[Window, int]:
        """Every window with its sum."""
        if isinstance(self.kind, Session):
            return {(key, s[0], s[1] + 1): s[2]
                    for key, sessions in self.sessions.items() for s in sessions}
        sums: Counter[Window] = Counter()
        for window in self._spans():
            key, start, end = window
            for k, t, value, arrived_at in self.accepted:
                if k == key and start <= t < end and arrived_at < end + self.kind.grace_ms:
                    sums[window] += value
        return {window: total for window, total in sums.items()
                if any(k == window[0] and window[1] <= t < window[2]
                       and a < window[2] + self.kind.grace_ms
                       for k, t, _, a in self.accepted)}

    def _spans(self) -> set[Window]:
        if isinstance(self.kind, Sliding):
            d = self.kind.difference_ms
            spans = set()
            for key, u, _, _ in self.accepted:
                spans.add((key, u - d, u + 1))
                if any(k == key and u < v <= u + d + 1 for k, v, _, _ in self.accepted):
                    spans.add((key, u + 1, u + d + 2))
            return spans
        return {(key, start, end) for key, t, _, _ in self.accepted
                for start, end in self.fixed_windows(t)}

    def closed(self, window: Window) -> bool:
        extra = self.kind.gap_ms if isinstance(self.kind, Session) else 0
        return self.stream_time >= window[2] + extra + self.kind.grace_ms


def kinds() -> st.SearchStrategy[WindowKind]:
    """Window kinds of a few milliseconds (durations are given in seconds)."""
    ms = st.integers(1, 40).map(lambda n: n / 1000)
    grace = st.integers(0, 30).map(lambda n: n / 1000)
    hopping = st.tuples(st.integers(1, 40), st.integers(1, 40), grace).map(
        lambda t: Hopping(max(t) / 1000, advance=min(t[:2]) / 1000, grace=t[2]))
    return st.one_of(
        st.builds(lambda s, g: Tumbling(s, grace=g), ms, grace), hopping,
        st.builds(lambda s, g: Sliding(s, grace=g), ms, grace),
        st.builds(lambda s, g: Session(s, grace=g), ms, grace))


records = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 300),
                             st.integers(1, 5)), max_size=60)
"""(key, event time ms, value), arrival order: out of order by up to 300 ms."""


def run(kind: WindowKind, emit: Emit, input_records: list[tuple[str, int, int]],
        cuts: list[int]) -> tuple[ProcessorDriver, Windowed, LateCounter]:
    """Feed ``input_records`` to a windowed table in batches split at ``cuts``."""
    table, observer = MemoryTable("windows"), LateCounter()
    driver = ProcessorDriver(lambda c: Windowed(c, kind, emit), stores=[table])
    processor = driver.processor()
    assert isinstance(processor, Windowed)
    table.partitions[0].observer = observer
    bounds = sorted({0, len(input_records), *(c % (len(input_records) + 1) for c in cuts)})
    for low, high in itertools.pairwise(bounds):
        driver.process([make_message("in", value, key, timestamp=ts)
                        for key, ts, value in input_records[low:high]])
    return driver, processor, observer


def model_of(kind: WindowKind, input_records: list[tuple[str, int, int]]) -> Model:
    model = Model(kind)
    for key, ts, value in input_records:
        model.add(key, ts, value)
    return model


@settings(max_examples=150, deadline=None)
@given(kinds(), records, st.lists(st.integers(0, 1000), max_size=6))
def test_final_results_equal_the_model(kind: WindowKind, input_records: list[Any],
                                       cuts: list[int]) -> None:
    """emit="final": every closed window is emitted once, with the model's sum; open
    windows are still in the table with theirs; late records are counted as the model
    counts them; and no record affected a window after it closed."""
    _, processor, observer = run(kind, "final", input_records, cuts)
    model = model_of(kind, input_records)
    emitted = [(r.key, r.start, r.end, r.value) for batch in processor.batches for r in batch]
    assert len(emitted) == len({r[:3] for r in emitted}), "a window was emitted twice"
    expected = model.windows()
    assert {r[:3]: r[3] for r in emitted} == {w: v for w, v in expected.items()
                                               if model.closed(w)}
    still_open = {(key, r.start, r.end): r.value for key in ("a", "b")
                  for r in processor.table.fetch(key, -1000, 10_000)}
    assert {w: v for w, v in still_open.items() if not model.closed(w)} == {
        w: v for w, v in expected.items() if not model.closed(w)}
    assert observer.late == model.late
    assert processor.table.stream_time == model.stream_time


@settings(max_examples=150, deadline=None)
@given(kinds(), records, st.lists(st.integers(0, 1000), max_size=6))
def test_every_update_ends_at_the_model(kind: WindowKind, input_records: list[Any],
                                        cuts: list[int]) -> None:
    """emit="updates": a batch emits each window it changed once; the last value emitted
    for each window is the model's sum (sessions merged away end with None)."""
    _, processor, observer = run(kind, "updates", input_records, cuts)
    model = model_of(kind, input_records)
    last: dict[Window, Any] = {}
    for batch in processor.batches:
        windows = [(r.key, r.start, r.end) for r in batch]
        assert len(windows) == len(set(windows)), "a window was emitted twice in a batch"
        last.update({(r.key, r.start, r.end): r.value for r in batch})
    assert {w: v for w, v in last.items() if v is not None} == model.windows()
    assert observer.late == model.late


@settings(max_examples=60, deadline=None)
@given(kinds(), records, st.integers(0, 60))
def test_a_new_processor_on_the_same_store_carries_on(kind: WindowKind,
                                                      input_records: list[Any],
                                                      restart_at: int) -> None:
    """A processor built afresh mid-stream (a restart: the index is rebuilt from the
    store's entries) ends with the same final results as one that ran throughout."""
    table = MemoryTable("windows")
    results: list[Any] = []
    for part in (input_records[:restart_at], input_records[restart_at:]):
        driver = ProcessorDriver(lambda c: Windowed(c, kind, "final"), stores=[table])
        driver.process([make_message("in", value, key, timestamp=ts)
                        for key, ts, value in part])
        processor = driver.processor()
        assert isinstance(processor, Windowed)
        results += [r for batch in processor.batches for r in batch]
    _, whole, _ = run(kind, "final", input_records, [])
    assert sorted(results) == sorted(r for batch in whole.batches for r in batch)


def test_count_is_the_model_for_tumbling_windows() -> None:
    """count() counts records, not values."""
    kind = Tumbling(0.01, grace=0.005)

    class Counting(MessageProcessor):
        def __init__(self, context: ProcessorContext) -> None:
            self.table = WindowedTable(context, "windows", kind, count(), emit="final")
            self.results: list[Any] = []

        def process(self, messages: list[Message], sender: Sender) -> None:
            self.results += self.table.update((m.key, m.timestamp, m.value) for m in messages)

    driver = ProcessorDriver(Counting, stores=[MemoryTable("windows")])
    driver.process([make_message("in", 7, "a", timestamp=t) for t in (1, 5, 9, 12, 40)])
    processor = driver.processor()
    assert isinstance(processor, Counting)
    assert [tuple(r) for r in processor.results] == [("a", 0, 10, 3), ("a", 10, 20, 1)]
