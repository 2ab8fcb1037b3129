"""``Aggregation``: how a windowed table folds a window's records into one value (an
initializer, an aggregator, and a merger for session windows), and the usual ones:
``count()``, ``sum_of()`` and ``reduce()``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Aggregation", "count", "reduce", "sum_of"]


@dataclass(frozen=True)
class Aggregation:
    """A window's value starts as ``initializer()`` and each record in it makes it
    ``aggregator(value, record_value)``, in the order the records arrived. Session
    windows that a record bridges are combined with ``merger(earlier, later)`` (the
    sessions' values in start order) before the record is added.

    Values are kept in the table's store, so they must survive its serde (JSON by
    default: numbers, strings, lists, dicts).
    """

    initializer: Callable[[], Any]
    aggregator: Callable[[Any, Any], Any]
    merger: Callable[[Any, Any], Any] | None = None

    def fold(self, aggregate: Any, values: list[Any]) -> Any:
        """``aggregate`` with every value of ``values`` added, in order."""
        aggregator = self.aggregator
        for value in values:
            aggregate = aggregator(aggregate, value)
        return aggregate

    def merge(self, aggregates: list[Any]) -> Any:
        """The sessions' ``aggregates`` (in start order) merged into one."""
        if self.merger is None:
            raise ValueError("session windows need an Aggregation with a merger: "
                             "Aggregation(initializer, aggregator, merger)")
        merged = aggregates[0]
        for aggregate in aggregates[1:]:
            merged = self.merger(merged, aggregate)
        return merged


class _Count(Aggregation):
    def fold(self, aggregate: Any, values: list[Any]) -> Any:
        """``aggregate`` plus the number of values, in one step."""
        return aggregate + len(values)


class _Sum(Aggregation):
    def fold(self, aggregate: Any, values: list[Any]) -> Any:
        """``aggregate`` plus the values' sum, in one step."""
        return aggregate + sum(values)


def count() -> Aggregation:
    """The number of records in the window."""
    return _Count(_zero, _plus_one, operator.add)


def sum_of(value: Callable[[Any], Any] | None = None) -> Aggregation:
    """The sum of the records' values, or of ``value(record_value)`` (a field, say)."""
    if value is None:
        return _Sum(_zero, operator.add, operator.add)
    return Aggregation(_zero, lambda total, record: total + value(record), operator.add)


def reduce(function: Callable[[Any, Any], Any]) -> Aggregation:
    """The records' values combined pairwise with ``function`` (``max``, say); the first
    record's value as it is. Sessions merge with the same function."""
    def aggregator(aggregate: Any, value: Any) -> Any:
        return value if aggregate is None else function(aggregate, value)

    return Aggregation(_none, aggregator, function)


def _zero() -> int:
    return 0


def _none() -> None:
    return None


def _plus_one(total: int, _value: Any) -> int:
    return total + 1
