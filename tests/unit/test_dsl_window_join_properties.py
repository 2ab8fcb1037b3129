"""The DSL's windowed stream-stream joins (``join``, ``left_join``, ``outer_join`` with
``JoinWindows``) against a record-at-a-time model, with hypothesis: one interleaved
sequence over two topics, split into batches at random points (see
test_dsl_properties for the harness). Event times never go backwards in these
sequences, so no record is late here; test_dsl_window_join_unit covers late records.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_dsl_properties import FAST, Event, Out, builder, cuts, events, outputs, partition_of, run

from kasper_py.windows import JoinWindows


@dataclass
class Buffered:
    """A record the model holds: its side ("l"/"r"), key, time, value, whether joined."""

    side: str
    key: Any
    timestamp: int
    value: Any
    matched: bool = False


@dataclass(frozen=True)
class Windows:
    """A join's windows in milliseconds."""

    before: int
    after: int
    grace: int

    def of(self) -> JoinWindows:
        return JoinWindows(0, before=self.before / 1000, after=self.after / 1000,
                           grace=self.grace / 1000)

    def joins(self, mine: Buffered, theirs: Buffered) -> bool:
        left, right = (mine, theirs) if mine.side == "l" else (theirs, mine)
        return left.timestamp - self.before <= right.timestamp <= left.timestamp + self.after


class Partition:
    """One partition of the model: stream time and the buffered records of both sides."""

    def __init__(self, windows: Windows, how: str) -> None:
        self.windows, self.how = windows, how
        self.stream_time = -1
        self.buffered: list[Buffered] = []

    def sends_unmatched(self, side: str) -> bool:
        return self.how == "outer" or (self.how == "left" and side == "l")

    def add(self, record: Buffered, out: list[Out]) -> None:
        """Join ``record`` with the other side's buffered records; buffer it; expire."""
        w = self.windows
        self.stream_time = max(self.stream_time, record.timestamp)
        closes = w.after if record.side == "l" else w.before
        if self.stream_time > record.timestamp + closes + w.grace:
            return  # late (not in these sequences: times never go backwards)
        for theirs in self.buffered:
            if theirs.side != record.side and theirs.key == record.key \
                    and w.joins(record, theirs):
                left, right = (record, theirs) if record.side == "l" else (theirs, record)
                out.append((record.key, [left.value, right.value],
                            max(record.timestamp, theirs.timestamp)))
                theirs.matched = record.matched = True
        self.buffered.append(record)
        self.expire(out)

    def expire(self, out: list[Out]) -> None:
        """Drop the records no on-time record can join; send the unmatched ones."""
        w, kept = self.windows, []
        for record in self.buffered:
            if record.timestamp + w.before + w.after + w.grace < self.stream_time:
                if not record.matched and self.sends_unmatched(record.side):
                    pair = [record.value, None] if record.side == "l" else [None, record.value]
                    out.append((record.key, pair, record.timestamp))
            else:
                kept.append(record)
        self.buffered = kept


def window_join_model(sequence: list[Event], windows: Windows, how: str,
                      partitions: int) -> list[Out]:
    """The join record by record, each partition keeping its own stream time; records
    with a ``None`` key or value are dropped (they cannot join)."""
    model = defaultdict(lambda: Partition(windows, how))
    out: list[Out] = []
    for topic, key, value, timestamp in sequence:
        if key is not None and value is not None:
            model[partition_of(key, partitions)].add(
                Buffered(topic, key, timestamp, value), out)
    return out


def ordered(records: list[Out]) -> list[str]:
    return sorted(json.dumps(record) for record in records)


def pair(value: Any, other: Any) -> list[Any]:
    return [value, other]


join_windows = st.builds(Windows, st.integers(0, 8), st.integers(0, 8), st.integers(0, 4))


@FAST
@given(events(["l", "r"]), cuts, join_windows, st.sampled_from(["inner", "left", "outer"]),
       st.integers(1, 3))
def test_windowed_join_equals_the_model(sequence: list[Event], at: list[int],
                                        windows: Windows, how: str, partitions: int) -> None:
    """join, left_join and outer_join of two streams within JoinWindows(before, after,
    grace): each pair once, stamped with the later time; with left/outer each record
    of the side(s) that send unmatched records, once no on-time record can join it,
    with ``None`` for the other side and its own time; never both for one record.
    The same records as the model whatever the batch cuts."""
    b = builder()
    left, right = b.stream("l"), b.stream("r")
    join = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[how]
    join(right, pair, windows.of()).to("out")
    driver = run(b.build(), sequence, at, partitions=partitions)
    expected = window_join_model(sequence, windows, how, partitions)
    assert ordered(outputs(driver, "out")) == ordered(expected)


@FAST
@given(events(["l", "r"], key=st.sampled_from(["a", "b", "c"])), cuts, join_windows)
def test_a_rekeyed_side_joins_after_its_repartition(sequence: list[Event], at: list[int],
                                                    windows: Windows) -> None:
    """A re-keyed side goes through a repartition first; with one partition and one
    batch the join still equals the model's (the repartition is read in the same run
    of the driver), here with keys upper-cased on both sides."""
    b = builder()
    left = b.stream("l").select_key(lambda k, _v: k.upper())
    right = b.stream("r").map(lambda k, v: (k.upper(), v))
    left.join(right, pair, windows.of(), store="joined").to("out")
    driver = run(b.build(), sequence, [], partitions=1)
    upper = [(t, k.upper(), v, ts) for t, k, v, ts in sequence]
    assert ordered(outputs(driver, "out")) == ordered(
        window_join_model(upper, windows, "inner", 1))
