"""Output timestamps as Kafka Streams gives them (KIP-258's timestamped stores): an
aggregate carries the largest timestamp of the records folded into it, a table-table
join's value the larger of its two sides'. A table keeps these times in a store of its
own beside its values, ``<store>-timestamps`` (``TIMES``), so the values' store, what
queries read and its changelog stay as they were. A key without a kept time (a store
written before times were kept, or a record without a timestamp) has an unknown time,
older than any: the next record's time is then the largest.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from kasper_py.stores.base import KeyValueStore

__all__ = ["TIMES", "Times", "largest_times", "later"]

TIMES = "{}-timestamps"
"""The name of the store keeping the times of the table whose store is named ``{}``."""
_TIME_OF = operator.itemgetter(2)


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
