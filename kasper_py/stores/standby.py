"""Standby replicas: warm copies of other processes' local tables. A thread of its own,
with a group-less consumer per table (read_committed, so an aborted transaction's
writes never reach a copy), tails the changelogs of the partitions this process keeps
warm into the RocksDB folders an owner would open, recording the next changelog offset
applied as a restore does. Promotion is the ordinary open (``RocksDBTable.open``), which
then reads only the changelog's tail. A standby never produces and never commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import KasperError
from kasper_py.observability.observe import StoreObserver
from kasper_py.stores.base import StoreSpec, encode_keys
from kasper_py.stores.changelog import ChangelogReader, restore_plan
from kasper_py.stores.localdb import LocalDB
from kasper_py.stores.query import WarmCopy
from kasper_py.stores.rocksdb import RocksDBTable

__all__ = ["StandbyReplicas", "standby_tables"]

_log = structlog.get_logger("kasper_py")
_IDLE_WAIT = 0.1
"""Seconds the thread sleeps when no changelog had anything new."""
_LAG_EVERY = 1.0
"""Seconds between lag reports (each asks the broker for the changelogs' watermarks)."""


class _WarmTable(WarmCopy):
    """One warm partition of a table, read by queries (``?stale=ok``)."""

    def __init__(self, table: RocksDBTable, db: LocalDB) -> None:
        self.table, self.db = table, db
        self.lag = 0

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """RocksDB ``MultiGet`` of the copy's applied (committed) values."""
        keys = list(keys)  # read twice: encoded, then paired with its encodings
        values = self.db.query_get_many(encode_keys(self.table.key_serde, keys))
        decode = self.table.value_serde.decode
        return {key: decode(value) for key, value in zip(keys, values, strict=True)
                if value is not None}


@dataclass
class _Copy:
    """One table's warm partitions: their folders and the changelog reader."""

    table: RocksDBTable
    reader: ChangelogReader
    dbs: dict[int, LocalDB]
    level_at: dict[int, float] = field(default_factory=dict)
    """When each partition was last level with its changelog's end (monotonic)."""
    warm: dict[int, _WarmTable] = field(default_factory=dict)
    """What queries read, per partition."""


class StandbyReplicas:
    """Keeps ``partitions`` of every changelogged local table warm, on its own thread
    (so the owner's turns never wait for it) and its own consumers."""

    def __init__(self, config: Config, tables: Sequence[RocksDBTable],
                 partitions: Sequence[int], observer: StoreObserver) -> None:
        self.config, self.tables = config, list(tables)
        self.partitions = tuple(partitions)
        self._observer = observer
        self._copies: list[_Copy] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kasper-standby-{config.name}")
        self.error: KasperError | None = None
        """What stopped the thread, if anything did (also logged)."""

    def start(self) -> None:
        """Open the copies (each level with where its files stopped) and start tailing."""
        for table in self.tables:
            self._copies.append(self._open(table))
        self._thread.start()
        _log.info("kasper.standby_started", processor=self.config.name,
                  tables=[t.name for t in self.tables], partitions=list(self.partitions))

    def close(self) -> None:
        """Stop tailing, record where each copy stands, close the folders."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        for copy in self._copies:
            copy.reader.close()
            for db in copy.dbs.values():
                db.close()
        self._copies = []

    def queryable(self) -> dict[int, dict[str, WarmCopy]]:
        """The warm copies, by partition and table, for queries from any thread."""
        found: dict[int, dict[str, WarmCopy]] = {}
        for copy in list(self._copies):
            for partition, warm in copy.warm.items():
                found.setdefault(partition, {})[copy.table.name] = warm
        return found

    def _open(self, table: RocksDBTable) -> _Copy:
        topic = table.topic(self.config)
        reader = ChangelogReader(self.config, topic, timeout=table.restore_timeout)
        dbs, starts = {}, {}
        for partition in self.partitions:
            db = LocalDB(table.path(self.config, partition))
            low, high = reader.watermarks(partition)
            recorded = db.changelog_offset(partition) if db.topic() == topic else None
            start, wipe, _ = restore_plan(recorded, low, high)
            if wipe:
                db.reset(topic)
            db.standby = True
            dbs[partition], starts[partition] = db, start
        reader.assign(starts)
        return _Copy(table, reader, dbs, warm={p: _WarmTable(table, db) for p, db in dbs.items()})

    def _run(self) -> None:
        reported = 0.0
        try:
            while not self._stopping.is_set():
                applied = sum(self._tail(copy) for copy in self._copies)
                if time.monotonic() - reported >= _LAG_EVERY:
                    reported = time.monotonic()
                    for copy in self._copies:
                        self._report_lag(copy)
                if not applied:
                    self._stopping.wait(_IDLE_WAIT)
        except KasperError as exc:
            self.error = exc
            _log.error("kasper.standby_stopped", processor=self.config.name, error=str(exc),
                       error_type=type(exc).__name__)

    def _tail(self, copy: _Copy) -> int:
        """Apply what arrived; record each partition's position (past commit markers)."""
        applied = copy.reader.read_available(lambda p, records: copy.dbs[p].apply_records(
            p, records))
        for partition, position in copy.reader.positions.items():
            db = copy.dbs[partition]
            if (db.changelog_offset(partition) or 0) < position:
                db.write({}, {partition: position})
        return applied

    def _report_lag(self, copy: _Copy) -> None:
        """Lag of each copy in changelog offsets, and the seconds since it was level."""
        now = time.monotonic()
        positions = copy.reader.positions
        for partition in copy.dbs:
            _, high = copy.reader.watermarks(partition)
            offset = positions.get(partition, high)
            behind = max(high - offset, 0)
            if behind == 0 or partition not in copy.level_at:
                copy.level_at[partition] = now
            seconds = 0.0 if behind == 0 else now - copy.level_at[partition]
            copy.warm[partition].lag = behind
            self._observer.on_standby_lag(copy.table.name, partition, offset, behind,
                                          seconds)



def standby_tables(specs: Sequence[StoreSpec]) -> list[RocksDBTable]:
    """The tables a standby keeps warm: local ones with a changelog (a global table is
    whole in every process already)."""
    return [spec for spec in specs if isinstance(spec, RocksDBTable)
            and spec.changelog and not spec.global_table]
