"""The operators of a stage at run time, batch-first: each takes the list of records
a batch brings it and hands one list to each child. A record is the tuple
``(key, value, timestamp, headers)``. This module holds what every operator shares:
``Op``, the ``StageContext`` of a stage on one partition (not the loop's turn: the
batch's ``Sender`` and held tables), tables (``TableOp``; ``CachedTable`` holds a
table's updates until the stage's batch ends, Kafka Streams' record cache). Stateless
chains and branches are in ``_chain``, tables and joins in ``_tables``,
aggregations in ``_aggregate``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from kasper_py.dsl._packing import Packer
from kasper_py.message import Headers
from kasper_py.processor import ProcessorContext
from kasper_py.sender import Sender, SendRecord

__all__ = ["Windowed"]

Rec = tuple[Any, Any, "int | None", Headers]
"""(key, value, timestamp ms, headers): a record between operators."""
Records = list[Rec]
_KEY, _VALUE = operator.itemgetter(0), operator.itemgetter(1)


class Windowed(NamedTuple):
    """The key of a windowed aggregate's record: the grouped ``key`` and its window
    ``[start, end)`` in milliseconds (Kafka Streams' ``Windowed<K>``)."""

    key: Any
    start: int
    end: int


class Op:
    """An operator: ``push`` gets a batch's records, ``emit`` hands records on."""

    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: list[Op] = []

    def push(self, records: Records) -> None:
        """Take one batch's records (never empty)."""
        self.emit(records)

    def side(self, index: int) -> Op:
        """Where input ``index`` of a two-input operator is pushed."""
        raise TypeError(f"{type(self).__name__} has one input")

    def emit(self, records: Records) -> None:
        if records:
            for child in self.children:
                child.push(records)


class OneByOne(Op):
    """Pushes a batch's records to ``op`` one at a time: before a fork whose paths meet
    again (``_graph.reconverges``), where batches would come out of order."""

    __slots__ = ("op",)

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op = op

    def push(self, records: Records) -> None:
        push = self.op.push
        for record in records:
            push([record])


class TableOp(Op):
    """An operator whose output is a table: its records are updates (``None`` value: a
    delete), and ``lookup_many`` reads its current values."""

    __slots__ = ()

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """The current value of each of ``keys`` that has one."""
        raise NotImplementedError

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        """The time of each of ``keys``' current value that has a known one (what a
        table-table join stamps its results with, ``_times``); none by default."""
        return {}


class CachedTable(TableOp):
    """A table whose updates (``update``) are held, with ``cache``, until the stage's
    batch ends: then (``flush``) each key changed in the batch is emitted once, with
    its latest value, timestamp and headers, in the order of their latest updates
    (Kafka Streams' record cache, flushed at each commit). Without ``cache`` every
    update goes on at once. ``serial``: the held updates go on one at a time (the
    table's children meet again, ``_graph.reconverges``)."""

    __slots__ = ("cache", "held", "serial")

    def __init__(self, cache: bool) -> None:
        super().__init__()
        self.cache, self.serial = cache, False
        self.held: dict[Any, Rec] = {}

    def update(self, records: Records) -> None:
        """The table changed: ``records`` are its updates, in order."""
        if not self.cache:
            self.emit(records)
            return
        keys = list(map(_KEY, records))
        latest = dict(zip(keys, records, strict=True))  # C loops: each key's last record
        if len(latest) < len(keys):  # a key updated twice goes where its last update is
            latest = {key: latest[key] for key in reversed(dict.fromkeys(reversed(keys)))}
        held = self.held
        if held:
            for key in latest:
                held.pop(key, None)
        held.update(latest)

    def flush(self) -> None:
        """Emit the held updates (the stage's batch ended)."""
        if not self.held:
            return
        records, self.held = list(self.held.values()), {}
        if self.serial:
            for record in records:
                self.emit([record])
        else:
            self.emit(records)


class NullSkips:
    """Kafka Streams' rule for joins, aggregations and repartitions: a record with a
    ``None`` key (no partition to go to, nothing to join or group by) or, for joins and
    aggregations, a ``None`` value is skipped. Each is counted
    (``ProcessorContext.skipped``, reason ``null_key`` or ``null_value``): none goes
    silently."""

    __slots__ = ("context",)

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context

    def kept(self, records: Records, *, key: bool = True, value: bool = True,
             partial: str | None = None) -> Records:
        """``records`` with a key (unless ``key`` is false) and a value (unless ``value``
        is false), in order: the same list when none lacks one (C scans only); the
        others counted. ``partial``: a record whose last header is named so (a combined
        record) needs no value."""
        if not ((key and None in map(_KEY, records))
                or (value and None in map(_VALUE, records))):
            return records
        kept = [r for r in records if (r[0] is not None or not key) and (
            r[1] is not None or not value
            or (partial is not None and r[3] and r[3][-1][0] == partial))]
        null_keys = sum(1 for r in records if r[0] is None) if key else 0
        self.counted(null_keys, len(records) - len(kept) - null_keys)
        return kept

    def counted(self, null_keys: int = 0, null_values: int = 0) -> None:
        """Count records an operator skipped for lack of a key or a value."""
        if null_keys:
            self.context.skipped("null_key", null_keys)
        if null_values:
            self.context.skipped("null_value", null_values)


class StageContext:
    """What the operators of one stage on one partition share: the turn's ``Sender``
    (set for each batch), how records go to a repartition (packed by ``packer``, else
    one Kafka record each), and the tables that hold updates until the stage's batch
    ends, in the graph's order (a table flushed before every table downstream of it)."""

    sender: Sender

    def __init__(self, context: ProcessorContext, packer: Packer | None = None) -> None:
        self.cached: list[CachedTable] = []
        self.skips = NullSkips(context)
        """Where the stage's operators count the records they skip."""
        self._to_repartition: Callable[[Sender, str, Sequence[SendRecord]], None] = (
            Sender.repartition_many if packer is None else packer.send)

    def repartition(self, name: str, records: Sequence[SendRecord]) -> None:
        """Send a batch's ``records`` (each with a key) to repartition ``name``, in order."""
        self._to_repartition(self.sender, name, records)

    def start(self) -> None:
        """A batch begins: nothing held (a failed batch's updates are not emitted)."""
        for table in self.cached:
            table.held.clear()

    def end(self) -> None:
        """The stage's batch is done: every held update goes on, upstream first."""
        for table in self.cached:
            table.flush()
