"""The ``timestamps="latest"`` mode of a builder (``TIMESTAMPS``): output timestamps as
Kafka Streams gives them (KIP-258's timestamped stores). An aggregate carries the
largest timestamp of the records folded into it (``TimedAggregate``; a combined partial
the largest of its records, ``TimedCombine``), a table-table join's value the larger of
its two sides'. A table keeps these times in a store of its own beside its values,
``<store>-timestamps`` (``TIMES``), so the values' store, what queries read and its
changelog stay as they were. A key without a kept time (a store written before times
were kept, or a record without a timestamp) has an unknown time, older than any: the
next record's time is then the largest. The default mode, ``"record"``, keeps no times:
an output carries the time of the record that made it (the operators of ``_aggregate``).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Literal, get_args

from kasper_py.dsl._aggregate import PARTIAL, Aggregate, Combine, Folding, key_counts, own_headers
from kasper_py.dsl._ops import NullSkips, Records
from kasper_py.exceptions import ConfigError
from kasper_py.sender import SendRecord
from kasper_py.stores.base import KeyValueStore

__all__ = ["TIMES", "TIMESTAMPS", "TimedAggregate", "TimedCombine", "Times",
           "Timestamps", "largest_times", "later", "timestamps_mode"]

Timestamps = Literal["record", "latest"]
"""How a builder stamps the outputs of aggregations and table-table joins: ``"record"``
(the default) with the time of the record that made the output, ``"latest"`` with the
latest time of what the output holds (Kafka Streams' stamps, times kept in stores)."""
TIMESTAMPS: tuple[Timestamps, ...] = get_args(Timestamps)

TIMES = "{}-timestamps"
"""The name of the store keeping the times of the table whose store is named ``{}``."""
_KEY, _TIME_OF = operator.itemgetter(0), operator.itemgetter(2)


def later(first: int | None, second: int | None) -> int | None:
    """The larger of two times, an unknown one (``None``) older than any."""
    if first is None:
        return second
    return first if second is None or first >= second else second


def largest_times(keys: Sequence[Any], records: Sequence[Any]) -> dict[Any, int | None]:
    """Each key's largest timestamp among ``records`` (``keys[i]`` is record ``i``'s
    key); ``None`` when none of its records has one. Records in time order, the usual
    case, are checked and read in C loops: each key's last record is its largest."""
    stamps = list(map(_TIME_OF, records))
    if None not in stamps and all(map(operator.le, stamps, islice(stamps, 1, None))):
        return dict(zip(keys, stamps, strict=True))
    largest: dict[Any, int | None] = dict.fromkeys(keys)
    for key, stamp in zip(keys, stamps, strict=True):
        if stamp is not None:
            held = largest[key]
            if held is None or stamp > held:
                largest[key] = stamp
    return largest


class Times:
    """The kept times of a table's keys, in ``store`` (keys as the table's, values the
    times in ms): read and written once per batch with the table's values."""

    __slots__ = ("store",)

    def __init__(self, store: KeyValueStore) -> None:
        self.store = store

    def get_many(self, keys: Iterable[Any]) -> dict[Any, int]:
        """The kept time of each of ``keys`` that has one."""
        return self.store.get_many(keys)

    def put_many(self, times: dict[Any, int | None]) -> None:
        """Keep ``times`` (``None``: the key's time is forgotten, as when it is deleted)."""
        self.store.put_many(times)


def timestamps_mode(timestamps: str) -> Timestamps:
    """``timestamps`` checked as one of ``TIMESTAMPS`` (a ``ConfigError`` naming it)."""
    for mode in TIMESTAMPS:
        if timestamps == mode:
            return mode
    raise ConfigError("dsl", f"Builder(timestamps={timestamps!r}): timestamps is one of "
                             f"{', '.join(map(repr, TIMESTAMPS))}")


class TimedAggregate(Aggregate):
    """An ``Aggregate`` whose updates are stamped with the largest timestamp folded into
    the aggregate so far, kept in ``times``; a deleted key's time is forgotten."""

    __slots__ = ("times",)

    def __init__(self, store: KeyValueStore, times: Times, folding: Folding, cache: bool,
                 skips: NullSkips) -> None:
        super().__init__(store, folding, cache, skips)
        self.times = times

    def _fold_batch(self, kept: Records) -> None:
        keys = {r[0] for r in kept}
        current = self.store.get_many(keys)
        times: dict[Any, int | None] = dict(self.times.get_many(keys))
        out = self._fold(kept, current)
        stamped: Records = []
        for key, aggregate, timestamp, headers in out:
            stamp = later(times.get(key), timestamp)
            stamped.append((key, aggregate, stamp, headers))
            if aggregate is None:
                times.pop(key, None)
            else:
                times[key] = stamp
        self.store.put_many({key: current.get(key) for key in keys})
        self.times.put_many({key: times.get(key) for key in keys})
        self.update(stamped)

    def _count(self, records: Records) -> None:
        keys, counts = key_counts(records)
        if not counts:
            return
        totals, held = self.store.get_many(counts.keys()), self.times.get_many(counts.keys())
        for key, n in counts.items():
            totals[key] = totals.get(key, 0) + n
        stamps = largest_times(keys, records)
        for key, stamp in held.items():
            stamps[key] = later(stamp, stamps[key])
        self.store.put_many(totals)
        self.times.put_many(stamps)
        latest = dict(zip(keys, records, strict=True))
        self.update([(key, totals[key], stamps[key], own_headers(latest[key][3]))
                     for key in reversed(dict.fromkeys(reversed(keys))) if key in counts])

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        return self.times.get_many(keys)


class TimedCombine(Combine):
    """A ``Combine`` whose partials carry the largest time of their records."""

    __slots__ = ()

    @staticmethod
    def stamp(held: int | None, timestamp: int | None) -> int | None:
        """The later of the partial's time and the record's."""
        return later(held, timestamp)

    def _count(self, records: Records) -> list[SendRecord]:
        keys = list(map(_KEY, records))
        latest = dict(zip(keys, records, strict=True))
        stamps = largest_times(keys, records)
        return [(key, None, stamps[key], (*latest[key][3], (PARTIAL, b"%d" % n)))
                for key, n in Counter(keys).items()]
