"""Standby replicas: warm copies of other processes' local tables. A thread of its own,
with a group-less consumer per table (read_committed, so an aborted transaction's
writes never reach a copy), tails the changelogs of the partitions this process keeps
warm into the RocksDB folders an owner would open, recording the next changelog offset
applied as a restore does. Promotion is the ordinary open (``RocksDBTable.open``), which
then reads only the changelog's tail; in a running process the copy first hands its
folder over (``promote``). The partitions kept warm may change while it runs (``keep``,
or the ``placement`` the thread asks): a group member's follow the group. A standby never
produces and never commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
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
_PLACE_EVERY = 1.0
"""Seconds between two asks of the ``placement`` (each describes the group)."""

Placement = Callable[[], "Collection[int] | None"]
"""The partitions to keep warm now, or ``None`` to keep what is kept."""


class _WarmTable(WarmCopy):
    """One warm partition of a table, read by queries (``?stale=ok``)."""

    def __init__(self, table: RocksDBTable, db: LocalDB, lag: int) -> None:
        self.table, self.db = table, db
        self.lag = lag
        """Changelog offsets behind the owner's, as last measured (at the open: what the
        copy has yet to read)."""

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
    unflushed: set[int] = field(default_factory=set)
    """Partitions with records applied since their memtables were last flushed."""


class StandbyReplicas:
    """Keeps ``partitions`` of every changelogged local table warm, on its own thread
    (so the owner's turns never wait for it) and its own consumers. A ``placement``,
    asked every ``_PLACE_EVERY`` seconds on that thread, changes the partitions kept."""

    def __init__(self, config: Config, tables: Sequence[RocksDBTable],
                 partitions: Sequence[int], observer: StoreObserver, *,
                 placement: Placement | None = None) -> None:
        self.config, self.tables = config, list(tables)
        self._kept = self._asked = tuple(sorted(set(partitions)))
        """Kept warm now; asked to be kept (the owned ones left out of ``_kept``)."""
        self._observer, self._placement = observer, placement
        self._copies: list[_Copy] = []
        self._owned: set[int] = set()
        """Partitions this process's owner opened (``promote``): never kept warm here."""
        self._lock = threading.Lock()
        """Held by the thread while it applies a chunk, and by a change of the copies."""
        self._handover = threading.Event()
        """Set while the loop waits for the lock, so the thread steps aside."""
        self._place_now = threading.Event()
        """Set when the owner's partitions changed: the placement is asked at once."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kasper-standby-{config.name}")
        self.error: KasperError | None = None
        """What stopped the thread, if anything did (also logged)."""

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions kept warm now."""
        return self._kept

    def start(self) -> None:
        """Open the copies (each level with where its files stopped) and start tailing."""
        for table in self.tables:
            topic = table.topic(self.config)
            reader = ChangelogReader(self.config, topic, timeout=table.restore_timeout)
            self._copies.append(_Copy(table, reader, {}))
        self._change(self._kept)
        self._thread.start()
        _log.info("kasper.standby_started", processor=self.config.name,
                  tables=[t.name for t in self.tables], partitions=list(self._kept))

    def keep(self, partitions: Collection[int]) -> None:
        """Keep ``partitions`` warm from now on (less any this process owns): the new
        ones brought level with where their files stopped, the others let go."""
        with self._stepping_in():
            self._change(partitions)

    def promote(self, partitions: Collection[int]) -> None:
        """This process's owner is about to open ``partitions``: their copies stop and
        hand over their folders, still marked warm, so the open reads only the tail."""
        with self._stepping_in():
            self._owned.update(partitions)
            self._change(self._asked)
        self._place_now.set()

    def revoked(self, partitions: Collection[int]) -> None:
        """This process's owner closed ``partitions``: those among the partitions to keep
        warm are kept warm again, brought level with where the owner's files stopped."""
        with self._stepping_in():
            self._owned.difference_update(partitions)
            self._change(self._asked)
        self._place_now.set()

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

    def _stepping_in(self) -> _SteppingIn:
        return _SteppingIn(self._lock, self._handover)

    def _change(self, partitions: Collection[int]) -> None:
        """Under the lock: keep exactly ``partitions`` (less the owned ones) warm."""
        self._asked = tuple(sorted(set(partitions)))
        wanted = sorted(set(partitions) - self._owned)
        for copy in self._copies:
            gone = [p for p in copy.dbs if p not in wanted]
            added = [p for p in wanted if p not in copy.dbs]
            if not gone and not added:
                continue
            positions = copy.reader.positions
            starts = {p: positions[p] for p in copy.dbs if p in wanted and p in positions}
            for partition in gone:
                copy.dbs.pop(partition).close()  # still marked warm for the next owner
                copy.level_at.pop(partition, None)
                self._observer.on_standby_stopped(copy.table.name, partition)
            lags = {p: warm.lag for p, warm in copy.warm.items() if p in copy.dbs}
            for partition in added:
                copy.dbs[partition], starts[partition], lags[partition] = self._open(
                    copy, partition)
            copy.reader.assign(starts)
            copy.warm = {p: _WarmTable(copy.table, db, lags[p]) for p, db in copy.dbs.items()}
        if tuple(wanted) != self._kept:
            _log.info("kasper.standby_placed", processor=self.config.name,
                      partitions=wanted, owned=sorted(self._owned))
        self._kept = tuple(wanted)

    def _open(self, copy: _Copy, partition: int) -> tuple[LocalDB, int, int]:
        """A partition's folder, marked warm, where its changelog resumes, and how many
        offsets it has to read to be level."""
        topic = copy.reader.topic
        db = LocalDB(copy.table.path(self.config, partition))
        low, high = copy.reader.watermarks(partition)
        recorded = db.changelog_offset(partition) if db.topic() == topic else None
        start, wipe, _ = restore_plan(recorded, low, high)
        if wipe:
            db.reset(topic)
        db.standby = True
        return db, start, max(high - start, 0)

    def _run(self) -> None:
        reported = placed = 0.0
        try:
            while not self._stopping.is_set():
                if self._handover.is_set():  # the loop is changing the copies
                    self._stopping.wait(0.005)
                    continue
                if self._placement is not None and (
                        self._place_now.is_set() or time.monotonic() - placed >= _PLACE_EVERY):
                    self._place_now.clear()
                    placed = time.monotonic()
                    self._place()
                with self._lock:
                    applied = sum(self._tail(copy) for copy in self._copies)
                    if time.monotonic() - reported >= _LAG_EVERY:
                        reported = time.monotonic()
                        for copy in self._copies:
                            self._report_lag(copy)
                    if not applied:
                        self._flush_idle()
                if not applied:
                    self._stopping.wait(_IDLE_WAIT)
        except KasperError as exc:
            self.error = exc
            _log.error("kasper.standby_stopped", processor=self.config.name, error=str(exc),
                       error_type=type(exc).__name__)

    def _place(self) -> None:
        """Keep what the placement says (asked outside the lock: it reads the broker)."""
        assert self._placement is not None
        wanted = self._placement()
        if wanted is not None:
            with self._lock:
                self._change(wanted)

    def _flush_idle(self) -> None:
        """Level with the changelogs: flush the copies written since their last flush, here
        on the standby's thread, so that a promotion's close of the folder (which flushes
        what is left: 0.27 s for 1M keys' memtable) costs next to nothing."""
        for copy in self._copies:
            for partition in copy.unflushed & set(copy.dbs):
                copy.dbs[partition].flush()
            copy.unflushed.clear()

    def _tail(self, copy: _Copy) -> int:
        """Apply what arrived; record each partition's position (past commit markers)."""

        def apply(partition: int, records: list[Any]) -> None:
            copy.dbs[partition].apply_records(partition, records)
            copy.unflushed.add(partition)

        applied = copy.reader.read_chunk(apply)
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


class _SteppingIn:
    """The loop's hold on the copies: the thread steps aside, then the lock is taken."""

    def __init__(self, lock: threading.Lock, handover: threading.Event) -> None:
        self._lock, self._handover = lock, handover

    def __enter__(self) -> None:
        self._handover.set()
        self._lock.acquire()

    def __exit__(self, *_exc: object) -> None:
        self._handover.clear()
        self._lock.release()


def standby_tables(specs: Sequence[StoreSpec]) -> list[RocksDBTable]:
    """The tables a standby keeps warm: local ones with a changelog (a global table is
    whole in every process already)."""
    return [spec for spec in specs if isinstance(spec, RocksDBTable)
            and spec.changelog and not spec.global_table]
