"""Local RocksDB tables (rocksdict), one database per input partition under
``Config.state_dir``, each backed by a compacted Kafka changelog it is restored from.
Changelog topics and restores are in changelog.py, the RocksDB folder itself
(``LocalDB``) in localdb.py; the turn's order is in turn.py.

A turn writes a table like this: ``flush()`` produces the buffered writes to the
changelog partition (deletes as tombstones) with the loop's producer; the loop waits
for their acks with the outputs' and commits; ``after_delivery()`` then applies them
locally in one ``WriteBatch`` together with the next changelog offset. A crash in
between leaves the local copy behind its changelog, and the next start reads the
difference back. With exactly-once the changelog records are in the turn's transaction
and are applied only once it committed, so the local copy never holds an aborted
turn's writes; restores read committed records only.

Queries (from other threads) read the RocksDB files, so they see committed turns only,
each whole (one ``WriteBatch``), a moment after their commit; a scan page is read from
one iterator, a consistent point-in-time view.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

try:  # before localdb.py imports it: a missing extra is named here
    import rocksdict  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "kasper_py.stores.rocksdb needs rocksdict: pip install kasper-py[rocksdb]") from exc

from kasper_py.config import Config
from kasper_py.exceptions import StoreError
from kasper_py.kafka.topics import changelog_topic
from kasper_py.message import OutgoingRecord, TopicPartitionKey
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import (
    BufferedStore,
    ChangelogSource,
    KeyValueStore,
    OwnedState,
    StoreRuntime,
    StoreSpec,
    Writes,
    encode_keys,
)
from kasper_py.stores.changelog import (
    ChangelogReader,
    ensure_changelog,
    restore_plan,
)
from kasper_py.stores.localdb import LocalDB
from kasper_py.stores.query import Scan, ScanPage
from kasper_py.stores.ttl import DATE_HEADER, Ttl

__all__ = ["GlobalTableStore", "LocalDB", "RocksDBStore", "RocksDBTable"]


class RocksDBStore(BufferedStore):
    """One partition of a local table: a RocksDB folder ``<state_dir>/<processor>/<table>/<p>``
    whose every write is also produced to changelog partition ``p``. Keys are the key
    serde's bytes, no prefix: the folder is the namespace."""

    def __init__(self, table: RocksDBTable, db: LocalDB, runtime: StoreRuntime, *,
                 changelog_offset: int = 0) -> None:
        super().__init__(table.name, table.key_serde, table.value_serde, runtime.observer)
        self.db = db
        self.processor, self.table = runtime.config.name, table.name
        self.partition = runtime.partition
        self.changelog_topic = table.topic(runtime.config) if table.changelog else None
        self._producer = runtime.producer if table.changelog else None
        self._table, self._config = table, runtime.config
        self._transactional = runtime.config.exactly_once
        self._changelog_offset: int | None = changelog_offset
        """``None`` after an aborted transaction wrote to the changelog: how many offsets
        it took is unknown until the changelog's end is read again."""
        self._in_flight: dict[bytes, bytes | None] = {}
        self._in_flight_count = 0
        self._ttl = table.ttl
        self._clock = None if table.ttl is None else table.ttl.clock(runtime.wall_clock,
                                                                     runtime.stream_time)
        if self._clock is not None:
            self._clock.seen(db.latest_write())
        self._written_ms = 0
        """The time (``Ttl.clock``) of the turn whose writes are in flight: their
        changelog records' timestamp, from which a restore computes the keys' expiry."""

    @property
    def round_trips(self) -> int:
        """Native calls into RocksDB: one ``MultiGet`` per ``get_many``, one ``WriteBatch``
        per applied turn. The changelog produce adds no wait of its own: the loop
        waits for its acks together with the outputs'."""
        return self.db.round_trips

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One RocksDB ``MultiGet`` of the keys."""
        values = self.db.get_many(keys)
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Produce the writes to ``<changelog>[p]`` (key and value as stored; a delete is
        a tombstone); they are applied locally in ``after_delivery``. Without a
        changelog the ``WriteBatch`` is written here."""
        # With a ttl the records carry the time their keys' expiry counts from (0: the
        # producer stamps them, as without one).
        written = self._written_ms = 0 if self._clock is None else self._clock.now()
        if self._producer is None or self.changelog_topic is None:
            self.db.write(writes, written_ms=written)
            return
        topic, partition = self.changelog_topic, self.partition
        records: list[OutgoingRecord] = [(topic, value, key, partition, None, None, written)
                                         for key, value in writes.items()]
        if written == 0 and self._clock is not None:
            # The producer would stamp timestamp 0 with its wall clock, and a restore would
            # date the keys (and the table's time) with that: the header keeps the 0.
            records = [(*record, [(DATE_HEADER, b"0")]) for record in records]
        self._producer.produce(records)
        self._in_flight.update(writes)
        self._in_flight_count += len(writes)

    def after_delivery(self) -> None:
        """Every changelog record of the turn is acked and the turn committed: apply them
        in one ``WriteBatch`` with ``changelog_offset/<p>`` moved past them (reported as
        op ``apply``). A transaction's records are followed by its commit marker, which
        takes an offset too."""
        if not self._in_flight:
            return
        if self._changelog_offset is None:
            # after an abort: we are the partition's only writer, so its end is ours
            _, end = self._table._changelog_reader(self._config).watermarks(self.partition)
        else:
            marker = 1 if self._transactional else 0
            end = self._changelog_offset + self._in_flight_count + marker
        self._changelog_offset = end
        self._observed("apply", lambda: self.db.write(self._in_flight, {self.partition: end},
                                                      self._written_ms))
        self._in_flight, self._in_flight_count = {}, 0
        self.observer.on_table_size(self.name, self.partition, self.size())

    def _expire(self) -> int:
        """With a ttl: buffer a delete (a changelog tombstone, once flushed) for up to
        ``ttl.sweep_limit`` keys whose expiry has passed, earliest first, leaving the
        keys this turn wrote; return how many. Called at open (after the restore) and
        by every flush, so a key lives at most until the first turn after it expired
        (later when more than ``sweep_limit`` keys expire at once)."""
        if self._ttl is None or self._clock is None:
            return 0
        limit, pending = self._ttl.sweep_limit, self._pending
        due = [key for key in self.db.expired(self._clock.now(), limit) if key not in pending]
        if due:
            pending.update(dict.fromkeys(due))
            self.observer.on_keys_expired(self.name, len(due))
        return len(due)

    def size(self) -> int:
        """RocksDB's estimate of the keys in this partition's files
        (``rocksdb.estimate-num-keys``; deletes not yet compacted may still count)."""
        return self.db.estimated_keys()

    def _drop_unapplied(self) -> None:
        """Forget the writes produced to the changelog but not applied (with exactly-once
        their transaction is aborted, so where the changelog ends is read again; without,
        the loop stops, and the records, if delivered, are read back on restart)."""
        if self._in_flight and self._transactional:
            self._changelog_offset = None
        self._in_flight, self._in_flight_count = {}, 0

    @property
    def changelog_offset(self) -> int | None:
        """Next changelog offset this partition's files have applied (``None`` for a
        moment after an aborted transaction wrote to the changelog)."""
        return self._changelog_offset

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate the table in key-byte order (a RocksDB iterator), buffered writes
        overlaid; buffered new keys come last."""
        decode_key, decode_value = self.key_serde.decode, self.value_serde.decode
        pending = dict(self._pending)
        for key, value in self.db.items():
            current: bytes | None = pending.pop(key, value)
            if current is not None:
                yield decode_key(key), decode_value(current)
        for key, new in pending.items():
            if new is not None:
                yield decode_key(key), decode_value(new)

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One RocksDB ``MultiGet`` of the applied files: committed turns only (writes
        are applied in ``after_delivery``, after the commit)."""
        values = self.db.query_get_many(keys)
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def query_scan(self, scan: Scan) -> ScanPage:
        """Committed pairs in key-byte order from a RocksDB iterator (``LocalDB.query_scan``)."""
        pairs, cursor = self.db.query_scan(scan)
        return self.decoded_page(pairs, cursor, ordered=True)

    def close(self) -> None:
        """Close the database (buffered, unflushed writes are dropped)."""
        self.db.close()


class _GlobalState:
    """All partitions of a changelog in one RocksDB folder, followed between turns."""

    def __init__(self, db: LocalDB, reader: ChangelogReader) -> None:
        self.db = db
        self.reader = reader
        self.stale = False

    def catch_up(self) -> int:
        """Apply the changelog records that arrived since the last call."""
        self.stale = False
        return self.reader.read_available(self.db.apply_records)

    def close(self) -> None:
        self.reader.close()
        self.db.close()


class GlobalTableStore(KeyValueStore):
    """A read-only view of a global table: every partition of its changelog, applied
    to ``<state_dir>/<processor>/<table>/global`` and kept current between batches."""

    def __init__(self, state: _GlobalState, key_serde: Serde, value_serde: Serde) -> None:
        self.key_serde, self.value_serde = key_serde, value_serde
        self._state = state

    @property
    def round_trips(self) -> int:
        """Native RocksDB calls of the shared database (reads and changelog applies)."""
        return self._state.db.round_trips

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Apply changelog records that arrived since the last turn, then one RocksDB
        ``MultiGet`` of the encoded keys."""
        if self._state.stale:
            self._state.catch_up()
        return self._read(keys, self._state.db.get_many)

    def _read(self, keys: Iterable[Any], multi_get: Callable[[list[bytes]], list[bytes | None]]
              ) -> dict[Any, Any]:
        """The values ``multi_get`` finds for ``keys`` (encoded), decoded."""
        keys = list(keys)  # read twice: encoded, then paired with its encodings
        encoded = dict(zip(encode_keys(self.key_serde, keys), keys, strict=True))
        values = multi_get(list(encoded))
        decode = self.value_serde.decode
        return {key: decode(value) for key, value in zip(encoded.values(), values, strict=True)
                if value is not None}

    def put_many(self, items: Mapping[Any, Any]) -> None:
        """Refused: a global table is written by its changelog's owner."""
        raise _read_only()

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Refused: a global table is written by its changelog's owner."""
        raise _read_only()

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Nothing to write; the next read first applies what the changelog gained."""
        self._state.stale = True

    def discard_pending(self) -> None:
        """Nothing is ever buffered."""

    def savepoint(self) -> object:
        """Nothing is ever buffered: no mark."""
        return None

    def rollback(self, savepoint: object) -> None:
        """Nothing is ever buffered: nothing to undo."""

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate every partition's keys, in key-byte order."""
        for key, value in self._state.db.items():
            yield self.key_serde.decode(key), self.value_serde.decode(value)

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """RocksDB ``MultiGet`` of the changelog records applied so far: as of the loop's
        last read of this table (a query never reads the changelog itself)."""
        return self._read(keys, self._state.db.query_get_many)

    def query_scan(self, scan: Scan) -> ScanPage:
        """Applied pairs of every changelog partition, in key-byte order."""
        pairs, cursor = self._state.db.query_scan(scan)
        decode_key, decode_value = self.key_serde.decode, self.value_serde.decode
        return ScanPage([(decode_key(k), decode_value(v)) for k, v in pairs], cursor, True)


def _read_only() -> StoreError:
    return StoreError("a global table is read-only: write to the table that owns its changelog")


class RocksDBTable(StoreSpec):
    """Declares a local table ``name``: one RocksDB per input partition, restored from
    the compacted changelog ``<processor>-<name>-changelog`` before any processing.

    ``global_table=True`` instead keeps every partition of ``changelog_topic`` (written
    by another processor) in one read-only database, current between batches.
    ``changelog=False`` keeps the table local only: lost with its folder.

    ``ttl`` (seconds, or a ``Ttl``) removes a key that long after its last write, with
    a changelog tombstone, so a restore never brings it back (see stores.md, "Time to
    live").
    """

    def __init__(self, name: str, *, key_serde: str | Serde = "str",
                 value_serde: str | Serde = "json", changelog: bool = True,
                 changelog_topic: str | None = None, global_table: bool = False,
                 replication_factor: int = -1, topic_config: Mapping[str, str] | None = None,
                 restore_timeout: float = 600.0, ttl: float | Ttl | None = None) -> None:
        if not name or "/" in name:
            raise ValueError(f"table name must be non-empty with no '/', got {name!r}")
        if global_table and not changelog:
            raise ValueError("a global table is read from its changelog: changelog=True")
        self.name = name
        self.key_serde, self.value_serde = serde_for(key_serde), serde_for(value_serde)
        self.changelog = changelog
        self.global_table = global_table
        self.replication_factor = replication_factor
        self.topic_config = dict(topic_config or {})
        self.restore_timeout = restore_timeout
        self.ttl = Ttl.of(ttl)
        if self.ttl is not None and global_table:
            raise ValueError("a global table is written by its changelog's owner: give "
                             "the ttl to that table")
        self._topic = changelog_topic
        self._reader: ChangelogSource | None = None
        self._global: _GlobalState | None = None

    def topic(self, config: Config) -> str:
        """The changelog topic of this table for processor ``config.name``."""
        return self._topic or changelog_topic(config.name, self.name)

    def owned_state(self, config: Config) -> OwnedState:
        """The changelog (unless the table is global: its writer owns that one, or kept
        without one) and the folder ``<state_dir>/<processor>/<table>``."""
        topics = (self.topic(config),) if self.changelog and not self.global_table else ()
        return OwnedState(topics, (Path(config.state_dir) / config.name / self.name,))

    def path(self, config: Config, partition: int | str) -> Path:
        """``<state_dir>/<processor>/<table>/<partition>``."""
        return Path(config.state_dir) / config.name / self.name / str(partition)

    def open(self, runtime: StoreRuntime) -> KeyValueStore:
        """Open partition ``runtime.partition``'s database, restoring it first when its
        files are missing or behind the changelog."""
        if self.global_table:
            return GlobalTableStore(self._open_global(runtime), self.key_serde,
                                    self.value_serde)
        if self.changelog and runtime.producer is None:
            raise StoreError(f"table {self.name!r} writes a changelog with the loop's "
                             "producer: run it in a TopicProcessor (or a ProcessorDriver), "
                             "or pass changelog=False")
        if self.changelog and runtime.changelogs is not None:  # in memory (the driver's)
            self._reader = runtime.changelogs.reader(self.topic(runtime.config))
        db = LocalDB(self.path(runtime.config, runtime.partition),
                     ttl_ms=None if self.ttl is None else self.ttl.ms)
        try:
            offset = self._restore(runtime, db) if self.changelog else 0
            db.mark_indexed()
        except BaseException:
            db.close()
            raise
        store = RocksDBStore(self, db, runtime, changelog_offset=offset)
        store._expire()  # the first turn reads no key that expired while it was away
        return store

    def _restore(self, runtime: StoreRuntime, db: LocalDB) -> int:
        """Bring ``db`` level with its changelog partition; return the next offset."""
        reader = self._changelog_reader(runtime.config)
        topic, partition = self.topic(runtime.config), runtime.partition
        low, high = reader.watermarks(partition)
        # Files written without a ttl hold no expiry: read them again from the changelog.
        indexed = self.ttl is None or db.expiry_indexed()
        recorded = db.changelog_offset(partition) if db.topic() == topic and indexed else None
        start, wipe, reason = restore_plan(recorded, low, high)
        from_standby = db.standby and not wipe
        if wipe:
            db.reset(topic)
        db.standby = False  # owned from now on
        reader.assign({partition: start})
        began = time.monotonic()
        try:
            records = reader.read_until({partition: high}, db.apply_records, runtime.observer,
                                        processor=runtime.config.name, table=self.name,
                                        reason="standby" if from_standby else reason)
            # Also where no record was read (an empty changelog): "up to date", not "missing".
            db.write({}, {partition: reader.positions[partition]})
            runtime.observer.on_restore_done(self.name, partition, records,
                                             time.monotonic() - began, from_standby)
            return reader.positions[partition]
        finally:
            reader.unassign()

    def _changelog_reader(self, config: Config) -> ChangelogSource:
        if self._reader is None:
            topic = self.topic(config)
            ensure_changelog(config, topic, replication_factor=self.replication_factor,
                             topic_config=self.topic_config)
            reader = ChangelogReader(config, topic, timeout=self.restore_timeout)
            self._reader = reader
            return reader
        return self._reader

    def _open_global(self, runtime: StoreRuntime) -> _GlobalState:
        if self._global is not None:
            return self._global
        config = runtime.config
        topic = self.topic(config)
        reader = ChangelogReader(config, topic, timeout=self.restore_timeout)
        db = LocalDB(self.path(config, "global"))
        try:
            starts, ends = self._global_plan(reader, db, topic)
            reader.assign(starts)
            reader.read_until(ends, db.apply_records, runtime.observer, processor=config.name,
                              table=self.name, reason="global table")
            # Record every partition, empty ones too: one left unrecorded reads as
            # "missing" next time and would wipe and re-read the whole table.
            db.write({}, {p: reader.positions[p] for p in ends})
        except BaseException:
            reader.close()
            db.close()
            raise
        self._global = _GlobalState(db, reader)
        return self._global

    def _global_plan(self, reader: ChangelogReader, db: LocalDB,
                     topic: str) -> tuple[dict[int, int], dict[int, int]]:
        """Start and end offsets per changelog partition; any stale partition wipes all."""
        marks = {p: reader.watermarks(p) for p in range(reader.partition_count())}
        same_topic = db.topic() == topic
        plans = {p: restore_plan(db.changelog_offset(p) if same_topic else None, low, high)
                 for p, (low, high) in marks.items()}
        if any(wipe for _, wipe, _ in plans.values()):
            db.reset(topic)
            return {p: low for p, (low, _) in marks.items()}, {p: m[1] for p, m in marks.items()}
        return {p: plan[0] for p, plan in plans.items()}, {p: m[1] for p, m in marks.items()}

    def close(self) -> None:
        """Close the changelog reader and the global table's database, if open."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._global is not None:
            self._global.close()
            self._global = None
