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

__all__ = ["LocalDB"]

_META = "kasper_meta"
_TOPIC_KEY = b"changelog_topic"
_STANDBY_KEY = b"standby"


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


class LocalDB:
    """One RocksDB folder: table data in the default column family (encoded key ->
    encoded value), and in ``kasper_meta`` the changelog topic and, per changelog
    partition, ``changelog_offset/<p>`` = the next changelog offset already applied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.round_trips = 0
        """Native calls made: multi-gets and ``WriteBatch`` writes."""
        self._closing = threading.Lock()
        """Held by ``close`` and by queries' reads: a query never reads a closed handle."""
        self._open()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Raw mode stores bytes as they are; rocksdict's stubs type its pickling mode.
            self._db: Any = Rdict(str(self.path), _options(), column_families={_META: _options()})
        except Exception as exc:
            raise StoreError(f"cannot open RocksDB at {self.path} (is another process using "
                             f"this partition?): {exc}") from exc
        self._meta: Any = self._db.get_column_family_handle(_META)
        self._meta_db: Any = self._db.get_column_family(_META)

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
              offsets: Mapping[int, int] | None = None) -> None:
        """One atomic ``WriteBatch``: puts, deletes (``None``), and changelog offsets."""
        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for partition, offset in (offsets or {}).items():
            batch.put(_offset_key(partition), str(offset).encode(), self._meta)
        self.round_trips += 1
        self._db.write(batch)

    def apply_records(self, partition: int, records: list[Any]) -> None:
        """Apply changelog records (confluent-kafka messages) and their next offset in
        one ``WriteBatch``; a ``None`` value is a tombstone."""
        batch = WriteBatch(raw_mode=True)
        for record in records:
            value = record.value()
            if value is None:
                batch.delete(record.key())
            else:
                batch.put(record.key(), value)
        next_offset = records[-1].offset() + 1
        batch.put(_offset_key(partition), str(next_offset).encode(), self._meta)
        self.round_trips += 1
        self._db.write(batch)

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

    def close(self) -> None:
        """Flush and close; the folder's LOCK is released once no handle is left."""
        with self._closing:
            if self._db is not None:
                self._db.close()
            # Column family handles keep the database open: drop every reference.
            self._db = self._meta = self._meta_db = None


def _offset_key(partition: int) -> bytes:
    return b"changelog_offset/%d" % partition
