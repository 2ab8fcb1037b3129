"""``LocalDB``: one RocksDB folder (rocksdict), the files of a local table's partition
or of a global table: data, the changelog topic it was written from and the next
changelog offset applied per partition. The table, its changelog and restores are in
rocksdb.py and changelog.py.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch  # rocksdb.py says which extra is missing

from kasper_py.exceptions import QueryUnavailableError, StoreError
from kasper_py.stores.query import Scan, next_key
from kasper_py.stores.ttl import changelog_date

__all__ = ["LocalDB"]

_META = "kasper_meta"
_EXPIRY = "kasper_expiry"
"""key -> the time it expires, 8 bytes big-endian milliseconds."""
_EXPIRY_ORDER = "kasper_expiry_order"
"""expiry time (8 bytes) + key -> nothing: the keys in the order they expire. An entry
whose key was rewritten or deleted since is stale; ``expired`` removes it when it
comes first."""
_MAX_WAL = 64 * 1024 * 1024
_TOPIC_KEY = b"changelog_topic"
_INDEXED_KEY = b"expiry_indexed"
_STANDBY_KEY = b"standby"
_LATEST_KEY = b"latest_write"
"""With a ttl: the newest time a write (a tombstone included) was dated with, 8 bytes."""


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


class LocalDB:
    """One RocksDB folder: table data in the default column family (encoded key ->
    encoded value), and in ``kasper_meta`` the changelog topic and, per changelog
    partition, ``changelog_offset/<p>`` = the next changelog offset already applied.

    ``ttl_ms`` (a table's time to live) also keeps each key's expiry, the time of its
    write plus ``ttl_ms``, in ``kasper_expiry`` and ``kasper_expiry_order``."""

    def __init__(self, path: Path, *, ttl_ms: int | None = None) -> None:
        self.path = path
        self.ttl_ms = ttl_ms
        self.round_trips = 0
        """Native calls made: multi-gets and ``WriteBatch`` writes."""
        self._closing = threading.Lock()
        """Held by ``close`` and by queries' reads: a query never reads a closed handle."""
        self._open()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Raw mode stores bytes as they are; rocksdict's stubs type its pickling mode.
            # The expiry column families only with a ttl: a table without one is as it was
            # (rocksdict opens the families a folder already has by itself).
            families = [_META] if self.ttl_ms is None else [_META, _EXPIRY, _EXPIRY_ORDER]
            options = _options()
            # The small families (offsets every turn, expiry) rarely fill a memtable,
            # and the write-ahead log is kept until every family flushed: bound it, so a
            # table that deletes as much as it writes (a ttl, a deduplicator's window)
            # stays small on disk too.
            options.set_max_total_wal_size(_MAX_WAL)
            self._db: Any = Rdict(str(self.path), options,
                                  column_families={name: _options() for name in families})
        except Exception as exc:
            raise StoreError(f"cannot open RocksDB at {self.path} (is another process using "
                             f"this partition?): {exc}") from exc
        self._meta: Any = self._db.get_column_family_handle(_META)
        self._meta_db: Any = self._db.get_column_family(_META)
        self._expiry: Any = None
        self._expiry_db: Any = None
        self._order: Any = None
        self._order_db: Any = None
        if self.ttl_ms is not None:
            self._expiry = self._db.get_column_family_handle(_EXPIRY)
            self._expiry_db = self._db.get_column_family(_EXPIRY)
            self._order = self._db.get_column_family_handle(_EXPIRY_ORDER)
            self._order_db = self._db.get_column_family(_EXPIRY_ORDER)

    def topic(self) -> str | None:
        """The changelog these files were written from, if recorded."""
        value = self._meta_db.get(_TOPIC_KEY)
        return None if value is None else bytes(value).decode()

    def changelog_offset(self, partition: int) -> int | None:
        """Next changelog offset of ``partition`` applied here, if recorded."""
        value = self._meta_db.get(_offset_key(partition))
        return None if value is None else int(value)

    @property
    def standby(self) -> bool:
        """True while a standby replica keeps these files (``stores.standby``): the next
        owner's restore then starts from a warm copy."""
        return self._meta_db.get(_STANDBY_KEY) is not None

    @standby.setter
    def standby(self, kept: bool) -> None:
        if kept:
            self._meta_db[_STANDBY_KEY] = b"1"
        elif self.standby:
            del self._meta_db[_STANDBY_KEY]

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """RocksDB ``MultiGet`` of encoded keys, in order. A failure is a ``StoreError``
        (reads happen inside ``process()``, which would report it as the user's error)."""
        self.round_trips += 1
        try:
            values: list[bytes | None] = self._db.get(keys)
        except Exception as exc:
            raise StoreError(f"RocksDB read at {self.path} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        return values

    def write(self, writes: Mapping[bytes, bytes | None],
              offsets: Mapping[int, int] | None = None, written_ms: int = 0) -> None:
        """One atomic ``WriteBatch``: puts, deletes (``None``), and changelog offsets;
        with a ttl, each key's expiry from ``written_ms``, the time of the write."""
        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._index(batch, [(key, value, written_ms) for key, value in writes.items()])
        if writes:
            self._date(batch, written_ms)
        for partition, offset in (offsets or {}).items():
            batch.put(_offset_key(partition), str(offset).encode(), self._meta)
        self.round_trips += 1
        self._db.write(batch)

    def apply_records(self, partition: int, records: list[Any]) -> None:
        """Apply changelog records (confluent-kafka messages) and their next offset in
        one ``WriteBatch``; a ``None`` value is a tombstone. With a ttl, each key's expiry
        counts from its last record's date (``ttl.changelog_date``)."""
        batch = WriteBatch(raw_mode=True)
        for record in records:
            key, value = record.key(), record.value()
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if self.ttl_ms is not None:
            dates = [changelog_date(record) for record in records]
            latest = {record.key(): (record.key(), record.value(), date)
                      for record, date in zip(records, dates, strict=True)}
            self._index(batch, list(latest.values()))
            self._date(batch, max(dates))
        next_offset = records[-1].offset() + 1
        batch.put(_offset_key(partition), str(next_offset).encode(), self._meta)
        self.round_trips += 1
        self._db.write(batch)

    def _index(self, batch: WriteBatch, writes: list[tuple[bytes, bytes | None, int]]) -> None:
        """With a ttl: move each written key's entry in the expiry order to its write
        time (``(key, value, written_ms)``) plus the ttl, or drop it for a delete; one
        ``MultiGet`` of the keys' current expiry finds the entries to move."""
        if self.ttl_ms is None or not writes:
            return
        self.round_trips += 1
        current = self._expiry_db.get([key for key, _, _ in writes])
        for (key, value, written_ms), old in zip(writes, current, strict=True):
            if old is not None:
                batch.delete(bytes(old) + key, self._order)
            if value is None:
                batch.delete(key, self._expiry)
                continue
            expires = (written_ms + self.ttl_ms).to_bytes(8, "big")
            batch.put(key, expires, self._expiry)
            batch.put(expires + key, b"", self._order)

    def expired(self, now_ms: int, limit: int) -> list[bytes]:
        """Up to ``limit`` keys whose expiry is ``now_ms`` or earlier, earliest first:
        one iterator over the head of the expiry order (never the whole table)."""
        due: list[bytes] = []
        now = now_ms.to_bytes(8, "big")
        for raw in self._order_db.keys(from_key=b""):  # an iterator from the first entry
            entry = bytes(raw)
            if entry[:8] > now or len(due) == limit:
                break
            due.append(entry[8:])
        return due

    def _date(self, batch: WriteBatch, written_ms: int) -> None:
        """With a ttl: raise ``latest_write`` to ``written_ms`` in ``batch``."""
        if self.ttl_ms is not None and written_ms > self.latest_write():
            batch.put(_LATEST_KEY, written_ms.to_bytes(8, "big"), self._meta)

    def latest_write(self) -> int:
        """With a ttl: the newest time a write was dated with (the newest changelog
        timestamp, once restored); 0 without a ttl or a write."""
        raw = None if self.ttl_ms is None else self._meta_db.get(_LATEST_KEY)
        return 0 if raw is None else int.from_bytes(bytes(raw), "big")

    def expiry_indexed(self) -> bool:
        """True when every key's expiry is recorded (the files were written with a ttl
        from the start, or restored with one): turning ttl on for a table whose files
        were written without one must restore them from the changelog."""
        return self._meta_db.get(_INDEXED_KEY) is not None

    def estimated_keys(self) -> int:
        """RocksDB's ``rocksdb.estimate-num-keys`` of the table's data."""
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (encoded key, encoded value) in key order."""
        for key, value in self._db.items():
            yield bytes(key), bytes(value)

    def query_get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """RocksDB ``MultiGet`` for a query thread: the applied (committed) values."""
        with self._closing:
            db = self._open_handle()
            values: list[bytes | None] = db.get(keys)
            return values

    def query_scan(self, scan: Scan) -> tuple[list[tuple[bytes, bytes]], str | None]:
        """Up to ``scan.limit`` pairs of ``scan``'s key range in key order, from one
        RocksDB iterator seeked to its start (``Rdict.items(from_key=...)``), and the
        cursor (the last key, hex) when more may follow."""
        lower, upper = scan.bounds()
        if scan.cursor is not None:
            lower = max(lower, next_key(bytes.fromhex(scan.cursor)))
        pairs: list[tuple[bytes, bytes]] = []
        with self._closing:
            for key, value in self._open_handle().items(from_key=lower):
                if upper is not None and bytes(key) >= upper:
                    return pairs, None
                if len(pairs) == scan.limit:
                    return pairs, pairs[-1][0].hex()
                pairs.append((bytes(key), bytes(value)))
        return pairs, None

    def _open_handle(self) -> Any:
        if self._db is None:
            raise QueryUnavailableError(f"RocksDB at {self.path} is closed (the partition "
                                        "left this process, or it is stopping)")
        return self._db

    def reset(self, topic: str) -> None:
        """Delete every key and offset, then record ``topic`` as the changelog."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()
        self._meta_db[_TOPIC_KEY] = topic.encode()
        self.mark_indexed()

    def mark_indexed(self) -> None:
        """Record whether the keys' expiry is kept (a ttl), as ``expiry_indexed`` reads it."""
        if self.ttl_ms is None:
            self._meta_db.delete(_INDEXED_KEY)
        else:
            self._meta_db[_INDEXED_KEY] = b"1"

    def flush(self) -> None:
        """Write every column family's memtable to files (RocksDB ``Flush``), so that a
        ``close`` soon after has little left to write."""
        for family in (self._db, self._meta_db, self._expiry_db, self._order_db):
            if family is not None:
                family.flush()

    def close(self) -> None:
        """Flush and close; the folder's LOCK is released once no handle is left."""
        with self._closing:
            if self._db is not None:
                self._db.close()
            # Column family handles keep the database open: drop every reference.
            self._db = self._meta = self._meta_db = None
            self._expiry = self._expiry_db = self._order = self._order_db = None


def _offset_key(partition: int) -> bytes:
    return b"changelog_offset/%d" % partition
