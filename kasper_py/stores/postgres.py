"""PostgreSQL-backed state (psycopg 3): ``PostgresTable`` declares a table,
``PostgresStore`` is one partition's view of it. A batch costs one ``SELECT`` per
``get_many`` and one SQL transaction per ``flush``: its upserts, deletes, appended rows
and (effectively-once, the default) the partition's input offsets commit together.

Rows live in three tables of ``schema`` (``<table>`` is the store's name unless given)::

    CREATE TABLE <table> (prefix text, partition int, key bytea, value jsonb,
                          PRIMARY KEY (prefix, partition, key))        -- upserts
    CREATE TABLE <table>_appended (prefix text, partition int,
                                   seq bigint GENERATED ALWAYS AS IDENTITY,
                                   value jsonb)                       -- appends, in order
    CREATE TABLE <table>_offsets (prefix text, partition int, topic text,
                                  next_offset bigint,
                                  PRIMARY KEY (prefix, partition, topic))

``prefix`` is the processor name unless given; ``key`` is the key serde's bytes;
``value`` is ``jsonb`` with the ``json`` value serde (typed: ``value->>'field'`` in
SQL), ``bytea`` (the serde's bytes) with any other. Tables made before values were
``jsonb`` keep ``bytea`` and keep working. Queries use a connection of their own and
read committed rows only: with effectively-once they see whole turns, never one that is
then replayed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kasper_py._support.urls import server_address
from kasper_py.config import Config
from kasper_py.exceptions import QueryUnavailableError, StoreError
from kasper_py.message import TopicPartitionKey
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import BufferedStore, OwnedState, StoreRuntime, StoreSpec, Writes
from kasper_py.stores.lifecycle import already_applied
from kasper_py.stores.query import Scan, ScanPage
from kasper_py.stores.retries import with_retries

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("kasper_py.stores.postgres needs psycopg 3: "
                      "pip install kasper-py[postgres]") from exc

__all__ = ["PostgresStore", "PostgresTable"]

T = TypeVar("T")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,48}$")
# Connection lost, server shutting down or starting: worth another attempt.
_RETRIABLE = (psycopg.OperationalError,)


class _Sql:
    """The statements of one table, ``%s`` placeholders in psycopg's style. ``values``
    is the value columns' type: ``jsonb`` (the serde's JSON text, typed and queryable in
    SQL) or ``bytea`` (the serde's bytes as they are); the Python side always deals in
    the serde's bytes, converted in the statements."""

    def __init__(self, schema: str, table: str, values: str) -> None:
        rows, appended, offsets = (f'"{schema}"."{table}"', f'"{schema}"."{table}_appended"',
                                   f'"{schema}"."{table}_offsets"')
        self.rows, self.values = rows, values
        self.create = (
            f'CREATE SCHEMA IF NOT EXISTS "{schema}"',
            f"CREATE TABLE IF NOT EXISTS {rows} (prefix text, partition int, key bytea, "
            f"value {values} NOT NULL, PRIMARY KEY (prefix, partition, key))",
            f"CREATE TABLE IF NOT EXISTS {appended} (prefix text, partition int, "
            f"seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, value {values} NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {offsets} (prefix text, partition int, topic text, "
            "next_offset bigint NOT NULL, PRIMARY KEY (prefix, partition, topic))")
        self.value_type = ("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                           "WHERE attrelid = %s::regclass AND attname = 'value'")
        stored, read = (("convert_from(v, 'UTF8')::jsonb", "convert_to(value::text, 'UTF8')")
                        if values == "jsonb" else ("v", "value"))
        where = "WHERE prefix = %s AND partition = %s"
        self.select = f"SELECT key, {read} FROM {rows} {where} AND key = ANY(%s)"
        self.upsert = (f"INSERT INTO {rows} (prefix, partition, key, value) "
                       f"SELECT %s, %s, k, {stored} FROM unnest(%s::bytea[], %s::bytea[]) "
                       "AS u(k, v) ON CONFLICT (prefix, partition, key) "
                       "DO UPDATE SET value = EXCLUDED.value")
        self.delete = f"DELETE FROM {rows} {where} AND key = ANY(%s)"
        self.copy_appended = f"COPY {appended} (prefix, partition, value) FROM STDIN"
        # COPY takes jsonb as its text, bytea as bytes
        self.copied: Callable[[bytes], Any] = bytes.decode if values == "jsonb" else bytes
        self.lock = "SELECT pg_advisory_xact_lock(hashtext(%s), %s)"
        self.offsets = f"SELECT topic, next_offset FROM {offsets} {where}"
        self.set_offsets = (
            f"INSERT INTO {offsets} (prefix, partition, topic, next_offset) "
            "SELECT %s, %s, t, o FROM unnest(%s::text[], %s::bigint[]) AS u(t, o) "
            "ON CONFLICT (prefix, partition, topic) DO UPDATE SET next_offset = "
            "EXCLUDED.next_offset")
        self.scan = f"SELECT key, {read} FROM {rows} {where} AND key >= %s"


class PostgresTable(StoreSpec):
    """Declares a PostgreSQL table ``name`` (``table`` in ``schema`` if given); each
    partition's store has its own connection to ``url``.

    ``effectively_once=True`` (the default) writes each turn's rows and the partition's
    input offsets in one SQL transaction, so replayed input is skipped and a restart
    resumes from the database. Connection failures are retried ``retries`` times,
    backing off from ``backoff`` seconds doubling up to ``max_backoff``, then raise
    ``StoreUnavailableError``.
    """

    def __init__(self, name: str, *, url: str = "postgresql://postgres@127.0.0.1:5432/postgres",
                 table: str | None = None, schema: str = "public",
                 key_serde: str | Serde = "str", value_serde: str | Serde = "json",
                 prefix: str | None = None, effectively_once: bool = True, retries: int = 5,
                 backoff: float = 0.1, max_backoff: float = 2.0, timeout: float = 5.0) -> None:
        for field, value in (("name", name), ("table", table or name), ("schema", schema)):
            if not _IDENTIFIER.match(value):
                raise ValueError(f"{field} must be a SQL identifier (letters, digits, _; "
                                 f"at most 49), got {value!r}")
        self.name, self.table, self.schema = name, table or name, schema
        self.url = url
        self.key_serde, self.value_serde = serde_for(key_serde), serde_for(value_serde)
        self.prefix = prefix
        self.effectively_once = effectively_once
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.timeout = timeout
        self.sql = _Sql(schema, self.table, "jsonb" if self.value_serde.name == "json"
                        else "bytea")
        self._created = False
        self._query_connection: psycopg.Connection[Any] | None = None

    def open(self, runtime: StoreRuntime) -> PostgresStore:
        """Return partition ``runtime.partition``'s store on a connection of its own;
        the tables are created once (``CREATE ... IF NOT EXISTS``) and an effectively-once
        store reads its applied offsets (one ``SELECT``)."""
        return PostgresStore(self, runtime)

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to ``url`` (transactions are explicit), the tables
        created on the first; a table that exists keeps its value type (one made before
        values were ``jsonb`` stays ``bytea``), and the statements follow it."""
        connection = psycopg.connect(self.url, autocommit=True, connect_timeout=max(
            1, round(self.timeout)))
        if not self._created:
            for statement in self.sql.create:
                connection.execute(statement)
            row = connection.execute(self.sql.value_type, (self.sql.rows,)).fetchone()
            if row is not None and row[0] != self.sql.values:
                self.sql = _Sql(self.schema, self.table, row[0])
            self._created = True
        return connection

    def query_connection(self) -> psycopg.Connection[Any]:
        """The connection queries share (psycopg serialises its use across threads)."""
        if self._query_connection is None or self._query_connection.closed:
            self._query_connection = self.connect()
        return self._query_connection

    def close(self) -> None:
        """Close the queries' connection (each store closes its own)."""
        if self._query_connection is not None:
            self._query_connection.close()
            self._query_connection = None

    def owned_state(self, config: Config) -> OwnedState:
        """Held in PostgreSQL: the rows of prefix ``<prefix>`` in the three tables."""
        prefix = self.prefix or config.name
        return OwnedState(external=f"PostgreSQL table {self.schema}.{self.table} (and its "
                          f"_appended, _offsets): rows of prefix {prefix!r} at {self.address}")

    @property
    def address(self) -> str:
        """The server's address and database, without credentials, for error messages."""
        return server_address(self.url, 5432, scheme="postgresql")


class PostgresStore(BufferedStore):
    """One partition of a PostgreSQL table: upserts by key (``put``/``delete``), rows
    appended in order (``append``/``append_many``), both buffered until ``flush``."""

    def __init__(self, table: PostgresTable, runtime: StoreRuntime) -> None:
        self.processor, self.partition = runtime.config.name, runtime.partition
        super().__init__(table.name, table.key_serde, table.value_serde, runtime.observer)
        self.effectively_once = table.effectively_once
        self.prefix = table.prefix or self.processor
        self._table = table
        self._connection: psycopg.Connection[Any] | None = None
        self._appended: list[bytes] = []
        self._applied: dict[TopicPartitionKey, int] = {}
        if self.effectively_once:
            self._applied = self._observed("open", self._read_offsets)

    def append(self, value: Any) -> None:
        """Buffer one row for ``<table>_appended`` (in the value serde's bytes)."""
        self.append_many([value])

    def append_many(self, values: Iterable[Any]) -> None:
        """Buffer rows for ``<table>_appended``, written in this order by ``flush`` with
        ``COPY ... FROM STDIN`` in the turn's transaction."""
        encode = self.value_serde.encode
        for value in values:
            encoded = encode(value)
            if encoded is None:
                raise StoreError(f"table {self.name!r}: an appended row cannot be None")
            self._appended.append(bytes(encoded))

    def flush(self, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """One transaction of the buffered upserts, deletes and appended rows (and the
        offsets, effectively-once); the buffers are empty afterwards, even on failure."""
        appended, self._appended = self._appended, []
        writes, self._pending = self._pending, {}
        if writes or appended or (self.effectively_once and next_offsets):
            self._observed("flush", lambda: self._flush(writes, appended, next_offsets))

    def _flush(self, writes: Writes, appended: list[bytes],
               next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        if self.effectively_once and already_applied(self._applied, next_offsets):
            return  # a replayed batch: the database holds its rows already
        self._call("transaction", lambda: self._transaction(writes, appended, next_offsets))
        if self.effectively_once:
            self._applied.update(next_offsets)

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """``flush`` without appended rows (``BufferedStore``'s contract)."""
        self._flush(writes, [], next_offsets)

    def savepoint(self) -> object:
        """The buffered writes, and how many rows were appended so far."""
        return dict(self._pending), len(self._appended)

    def rollback(self, savepoint: object) -> None:
        """Back to ``savepoint``: its writes, and the rows appended before it."""
        assert isinstance(savepoint, tuple)
        pending, appended = savepoint
        self._pending = dict(pending)
        del self._appended[appended:]

    def discard_pending(self) -> None:
        """Drop the buffered writes and appended rows, as a failed turn does."""
        super().discard_pending()
        self._appended.clear()

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets whose rows this partition already holds (read from
        ``<table>_offsets`` when opened, then kept by ``flush``)."""
        return dict(self._applied)

    @property
    def _sql(self) -> _Sql:
        return self._table.sql  # the table settles its value type on its first connection

    def close(self) -> None:
        """Close this partition's connection."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _transaction(self, writes: Writes, appended: list[bytes],
                     next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """``BEGIN``; effectively-once: ``pg_advisory_xact_lock`` of the partition, then
        the stored offsets, fenced like ``_check_offsets``; one ``INSERT ... SELECT FROM
        unnest(...) ON CONFLICT DO UPDATE`` of the upserts, one ``DELETE ... key =
        ANY(...)``, one ``COPY`` of the appended rows, one upsert of the offsets;
        ``COMMIT``."""
        scope = (self.prefix, self.partition)
        sets = [(k, v) for k, v in writes.items() if v is not None]
        deletes = [k for k, v in writes.items() if v is None]
        with self._connect().transaction() as transaction:
            cursor = transaction.connection.cursor()
            if self.effectively_once:
                cursor.execute(self._sql.lock, (f"{self._sql.offsets}/{self.prefix}",
                                                self.partition))
                if not self._check_offsets(dict(cursor.execute(self._sql.offsets, scope)),
                                           next_offsets):
                    return
            if sets:
                cursor.execute(self._sql.upsert, (*scope, [k for k, _ in sets],
                                                  [v for _, v in sets]))
            if deletes:
                cursor.execute(self._sql.delete, (*scope, deletes))
            if appended:
                with cursor.copy(self._sql.copy_appended) as copy:
                    copied = self._sql.copied
                    for value in appended:
                        copy.write_row((self.prefix, self.partition, copied(value)))
            if self.effectively_once and next_offsets:
                topics = [topic for topic, _ in next_offsets]
                cursor.execute(self._sql.set_offsets, (*scope, topics,
                                                       list(next_offsets.values())))

    def _check_offsets(self, stored: dict[str, int],
                       next_offsets: Mapping[TopicPartitionKey, int]) -> bool:
        """False when the database holds this batch already (an attempt whose ``COMMIT``
        reply was lost); a ``StoreError`` when another writer moved the offsets."""
        if next_offsets and all(stored.get(topic, -1) >= offset
                                for (topic, _), offset in next_offsets.items()):
            return False
        for tp in next_offsets:
            if stored.get(tp[0]) != self._applied.get(tp):
                raise StoreError(
                    f"postgres {self._table.address}: table {self.name!r} partition "
                    f"{self.partition} fenced: offset of {tp[0]} is {stored.get(tp[0])}, "
                    f"expected {self._applied.get(tp)}; another process writes this partition")
        return True

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``SELECT key, value ... WHERE key = ANY(%s)``."""
        rows = self._call("SELECT", lambda: self._connect().execute(
            self._sql.select, (self.prefix, self.partition, keys)).fetchall())
        return {bytes(k): bytes(v) for k, v in rows}

    def _read_offsets(self) -> dict[TopicPartitionKey, int]:
        rows = self._call("SELECT offsets", lambda: self._connect().execute(
            self._sql.offsets, (self.prefix, self.partition)).fetchall())
        return {(topic, self.partition): int(offset) for topic, offset in rows}

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``SELECT`` on the queries' connection, no retries (the caller may ask again)."""
        rows = self._query_call("SELECT", self._sql.select, (self.prefix, self.partition, keys))
        return {bytes(k): bytes(v) for k, v in rows}

    def query_scan(self, scan: Scan) -> ScanPage:
        """``SELECT key, value ... AND key >= %s [AND key < %s] ORDER BY key LIMIT
        <limit + 1>``: an ordered slice of the partition (``bytea`` compares as unsigned
        bytes); the cursor is the last key's hex."""
        lower, upper = scan.bounds()
        if scan.cursor is not None:
            lower = max(lower, bytes.fromhex(scan.cursor) + b"\x00")
        params: list[Any] = [self.prefix, self.partition, lower]
        statement = self._sql.scan
        if upper is not None:
            statement, params = f"{statement} AND key < %s", [*params, upper]
        rows = self._query_call("SELECT range", f"{statement} ORDER BY key LIMIT %s",
                                (*params, scan.limit + 1))
        pairs = [(bytes(k), bytes(v)) for k, v in rows[:scan.limit]]
        cursor = pairs[-1][0].hex() if len(rows) > scan.limit else None
        return self.decoded_page(pairs, cursor, ordered=True)

    def _query_call(self, what: str, statement: str, params: Sequence[Any]) -> list[Any]:
        try:
            return self._table.query_connection().execute(statement, params).fetchall()
        except psycopg.Error as exc:
            raise QueryUnavailableError(
                f"postgres {self._table.address}: {what} for a query of table "
                f"{self._table.table!r} failed: {exc}") from exc

    def _connect(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = self._table.connect()
        return self._connection

    def _call(self, command: str, request: Callable[[], T]) -> T:
        """Run ``request``, reconnecting and retrying when the connection fails, with
        exponential backoff; each attempt counts as a round trip."""
        what = f"{command} for table {self.name!r} partition {self.partition}"
        try:  # a broken connection is not reused
            return with_retries(self._table, request, retriable=_RETRIABLE,
                                where=f"postgres {self._table.address}", what=what,
                                counted=self._count_round_trips, before_retry=self.close)
        except psycopg.Error as exc:
            raise StoreError(f"postgres {self._table.address}: {what} failed: {exc}") from exc
