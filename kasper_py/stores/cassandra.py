"""Cassandra-backed state (cassandra-driver): ``CassandraTable`` declares a table,
``CassandraStore`` is one partition's view of it. A batch costs one wave of prepared
statements run concurrently per ``get_many`` and per ``flush``.

Rows live in ``<keyspace>.<table>``, one Cassandra partition per processor and input
partition, so a batch's reads and writes stay on one replica set::

    CREATE TABLE <keyspace>.<table> (
        prefix text, partition int, key blob, value blob,
        offsets map<text, bigint> static,     -- effectively-once: next offset per topic
        PRIMARY KEY ((prefix, partition), key))

``prefix`` is the processor name unless given; ``key`` and ``value`` are the serdes' bytes.

Queries use the table's session (the driver's sessions are thread-safe) and read what
turns flushed: a turn is written before its outputs are acked and its offsets
committed, so a reader may see a turn that then fails and is replayed from the last
commit (its writes applied again), and a turn of many chunks may be seen in part while
its unlogged batches land. Within one input partition rows are ordered by ``key``
(the clustering column, compared as unsigned bytes), so scans are ordered key ranges
of one Cassandra partition: cheap, unlike a scan across token order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kasper_py.config import Config
from kasper_py.exceptions import QueryUnavailableError, StoreError
from kasper_py.message import TopicPartitionKey
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import BufferedStore, OwnedState, StoreRuntime, StoreSpec, Writes
from kasper_py.stores.lifecycle import already_applied
from kasper_py.stores.query import Scan, ScanPage
from kasper_py.stores.retries import with_retries
from kasper_py.stores.ttl import Ttl

try:
    from cassandra import (
        ConsistencyLevel,
        CoordinationFailure,
        OperationTimedOut,
        ReadTimeout,
        Unavailable,
        WriteTimeout,
    )
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.connection import ConnectionException
    from cassandra.policies import (
        DCAwareRoundRobinPolicy,
        ExponentialReconnectionPolicy,
        TokenAwarePolicy,
    )
    from cassandra.query import BatchStatement, BatchType
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("kasper_py.stores.cassandra needs cassandra-driver: "
                      "pip install kasper-py[cassandra]") from exc

__all__ = ["CassandraStore", "CassandraTable"]

T = TypeVar("T")
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_RETRIABLE = (NoHostAvailable, OperationTimedOut, Unavailable, ReadTimeout, WriteTimeout,
              CoordinationFailure, ConnectionException)


class _Statements:
    """The prepared statements of one table; ``ttl`` (whole seconds) writes each value
    ``USING TTL``, so Cassandra drops it that long after its last write."""

    def __init__(self, session: Any, table: str, ttl: int | None = None) -> None:
        where = "WHERE prefix = ? AND partition = ?"
        using = "" if ttl is None else f" USING TTL {int(ttl)}"
        self.select = session.prepare(f"SELECT key, value FROM {table} {where} AND key IN ?")
        self.update = session.prepare(
            f"UPDATE {table}{using} SET value = ? {where} AND key = ?")
        self.delete = session.prepare(f"DELETE FROM {table} {where} AND key = ?")
        self.offsets = session.prepare(f"SELECT offsets FROM {table} {where} LIMIT 1")
        self.set_offsets = session.prepare(
            f"UPDATE {table} SET offsets = ? {where} IF offsets = ?")
        rows = f"SELECT key, value FROM {table} {where} AND key >= ?"
        self.scan_from = session.prepare(f"{rows} LIMIT ?")
        self.scan_range = session.prepare(f"{rows} AND key < ? LIMIT ?")


class CassandraTable(StoreSpec):
    """Declares a Cassandra table ``name`` (in ``keyspace``, created when absent with
    ``replication``); all partitions share one cluster session.

    ``consistency`` applies to reads and writes (``serial_consistency`` to the
    effectively-once condition). ``effectively_once=True`` writes each batch and its
    input offsets in one conditional batch, so replayed input is skipped. Failures to
    reach Cassandra are retried ``retries`` times with doubling backoff, then raise
    ``StoreUnavailableError``. ``ttl`` (seconds, rounded up to whole ones) writes every
    value ``USING TTL``: a key lives that long after its last write (the offsets,
    written apart, never expire).
    """

    def __init__(self, name: str, *, contact_points: Sequence[str] = ("127.0.0.1",),
                 port: int = 9042, keyspace: str = "kasper", table: str | None = None,
                 replication: Mapping[str, str | int] | None = None,
                 consistency: str = "LOCAL_QUORUM", serial_consistency: str = "LOCAL_SERIAL",
                 key_serde: str | Serde = "str", value_serde: str | Serde = "json",
                 prefix: str | None = None, effectively_once: bool = False, retries: int = 3,
                 backoff: float = 0.2, max_backoff: float = 2.0, timeout: float = 10.0,
                 chunk_size: int = 100, cluster_options: Mapping[str, Any] | None = None,
                 ttl: float | Ttl | None = None) -> None:
        self.name = name
        self.keyspace, self.table = _identifier("keyspace", keyspace), _identifier(
            "table", table or name)
        self.contact_points, self.port = list(contact_points), port
        self.replication = dict(replication or {"class": "SimpleStrategy",
                                                "replication_factor": 1})
        self.consistency = _consistency("consistency", consistency)
        self.serial_consistency = _consistency("serial_consistency", serial_consistency)
        self.key_serde, self.value_serde = serde_for(key_serde), serde_for(value_serde)
        self.prefix = prefix
        self.effectively_once = effectively_once
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.cluster_options = dict(cluster_options or {})
        self.ttl = Ttl.by_server(ttl, "a CassandraTable")
        self._cluster: Any = None
        self._session: Any = None
        self._statements: _Statements | None = None

    def owned_state(self, config: Config) -> OwnedState:
        """Held in Cassandra: the rows of prefix ``<prefix>`` in ``<keyspace>.<table>``."""
        prefix = self.prefix or config.name
        return OwnedState(external=f"Cassandra table {self.name!r}: rows of prefix "
                          f"{prefix!r} in {self.keyspace}.{self.table} at {self.address}")

    @property
    def address(self) -> str:
        """Contact points and port, for error messages."""
        return f"cassandra {','.join(self.contact_points)}:{self.port}"

    def open(self, runtime: StoreRuntime) -> CassandraStore:
        """Connect once (creating the keyspace and table when absent), then return
        partition ``runtime.partition``'s store."""
        statements = self._statements or retry(self, "connect", self._connect)
        return CassandraStore(self, self._session, statements, runtime)

    def close(self) -> None:
        """Shut the cluster connection down."""
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = self._statements = None

    def _connect(self) -> _Statements:
        profile = ExecutionProfile(
            consistency_level=self.consistency, serial_consistency_level=self.serial_consistency,
            request_timeout=self.timeout,
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()))
        options: dict[str, Any] = {
            "port": self.port, "execution_profiles": {EXEC_PROFILE_DEFAULT: profile},
            "reconnection_policy": ExponentialReconnectionPolicy(0.5, 10.0),
            "connect_timeout": self.timeout, **self.cluster_options}
        cluster = Cluster(self.contact_points, **options)
        try:
            session = cluster.connect()
            replication = ", ".join(f"'{k}': '{v}'" for k, v in self.replication.items())
            session.execute(f"CREATE KEYSPACE IF NOT EXISTS {self.keyspace} "
                            f"WITH replication = {{{replication}}}")
            table = f"{self.keyspace}.{self.table}"
            session.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (prefix text, partition int, key blob, "
                "value blob, offsets map<text, bigint> static, "
                "PRIMARY KEY ((prefix, partition), key))")
            ttl = None if self.ttl is None else math.ceil(self.ttl.seconds)
            statements = _Statements(session, table, ttl)
        except BaseException:
            cluster.shutdown()
            raise
        self._cluster, self._session, self._statements = cluster, session, statements
        return statements


class CassandraStore(BufferedStore):
    """One partition of a Cassandra table: rows ``(prefix, partition, key)`` of the
    Cassandra partition ``(prefix, partition)``."""

    def __init__(self, table: CassandraTable, session: Any, statements: _Statements,
                 runtime: StoreRuntime) -> None:
        super().__init__(table.name, table.key_serde, table.value_serde, runtime.observer)
        self.effectively_once = table.effectively_once
        self.processor, self.partition = runtime.config.name, runtime.partition
        self.prefix = table.prefix or self.processor
        self._table, self._session, self._statements = table, session, statements
        self._applied: dict[str, int] = {}
        if self.effectively_once:
            self._applied = self._observed("open", self._read_offsets)

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """Prepared ``SELECT key, value ... WHERE prefix = ? AND partition = ? AND key IN ?``
        per chunk of keys, all chunks concurrently."""
        select, scope = self._statements.select, (self.prefix, self.partition)
        requests = [(select, (*scope, chunk)) for chunk in self._chunks(keys)]
        results = self._call("SELECT", lambda: self._concurrently(requests))
        return {row.key: row.value for result in results for row in result}

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Unlogged single-partition ``BATCH``es of prepared ``UPDATE``/``DELETE``
        statements, one per chunk, run concurrently.

        Effectively-once: one ``BATCH`` of every write plus ``UPDATE ... SET offsets = ?
        IF offsets = ?`` (a lightweight transaction on the static column), so the
        writes and the offsets apply together, and only over the offsets this store read;
        nothing for a replayed batch (Cassandra holds its writes already).
        """
        if not self.effectively_once:
            statements = self._write_statements(writes)
            batches = [_batch(BatchType.UNLOGGED, c) for c in self._chunks(statements)]
            self._call("BATCH", lambda: self._concurrently([(b, None) for b in batches]))
        elif not already_applied(self.applied_offsets(), next_offsets):
            offsets = {**self._applied, **{topic: o for (topic, _), o in next_offsets.items()}}
            self._call("conditional BATCH", lambda: self._apply_with_offsets(writes, offsets))
            self._applied = offsets

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets whose effects this partition already holds (the static
        ``offsets`` column read at ``SERIAL`` consistency when opened, then kept by ``flush``)."""
        return {(topic, self.partition): offset for topic, offset in self._applied.items()}

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """The prepared ``SELECT key, value ... AND key IN ?``, chunks concurrently, no
        retries (the caller may ask again)."""
        select, scope = self._statements.select, (self.prefix, self.partition)
        requests = [(select, (*scope, chunk)) for chunk in self._chunks(keys)]
        results = self._query_call("SELECT", lambda: self._concurrently(requests))
        return {row.key: row.value for result in results for row in result}

    def query_scan(self, scan: Scan) -> ScanPage:
        """``SELECT key, value ... WHERE prefix = ? AND partition = ? AND key >= ?
        [AND key < ?] LIMIT <limit + 1>``: one ordered slice of the Cassandra partition;
        the cursor is the last key's hex."""
        lower, upper = scan.bounds()
        if scan.cursor is not None:
            lower = max(lower, bytes.fromhex(scan.cursor) + b"\x00")
        scope, limit = (self.prefix, self.partition), scan.limit + 1
        statement, params = ((self._statements.scan_from, (*scope, lower, limit))
                             if upper is None else
                             (self._statements.scan_range, (*scope, lower, upper, limit)))
        rows = list(self._query_call(
            "SELECT range", lambda: self._session.execute(statement, params)))
        pairs = [(bytes(row.key), bytes(row.value)) for row in rows[:scan.limit]]
        cursor = pairs[-1][0].hex() if len(rows) > scan.limit else None
        return self.decoded_page(pairs, cursor, ordered=True)

    def _query_call(self, what: str, request: Callable[[], T]) -> T:
        try:
            return request()
        except Exception as exc:
            raise QueryUnavailableError(
                f"{self._table.address}: {what} for a query of table {self._table.keyspace}."
                f"{self._table.table} failed: {type(exc).__name__}: {exc}") from exc

    def _chunks(self, items: list[T]) -> list[list[T]]:
        size = self._table.chunk_size
        return [items[i:i + size] for i in range(0, len(items), size)]

    def _write_statements(self, writes: Writes) -> list[tuple[Any, tuple[Any, ...]]]:
        update, delete = self._statements.update, self._statements.delete
        scope = (self.prefix, self.partition)
        return [(delete, (*scope, key)) if value is None else (update, (value, *scope, key))
                for key, value in writes.items()]

    def _apply_with_offsets(self, writes: Writes, offsets: dict[str, int]) -> None:
        batch = _batch(BatchType.LOGGED, self._write_statements(writes))
        batch.add(self._statements.set_offsets,
                  (offsets, self.prefix, self.partition, self._applied or None))
        result = self._session.execute(batch)
        if result.was_applied:
            return
        current = dict(result.one().offsets or {})
        if current != offsets:  # equal: a retried batch whose first reply was lost
            raise StoreError(
                f"{self._table.address}: table {self._table.table!r} partition "
                f"{self.partition} is fenced: its offsets are {current}, expected "
                f"{self._applied}; another process writes this partition")

    def _read_offsets(self) -> dict[str, int]:
        bound = self._statements.offsets.bind((self.prefix, self.partition))
        bound.consistency_level = self._table.serial_consistency
        row = self._call("SELECT offsets", lambda: self._session.execute(bound).one())
        return dict(row.offsets or {}) if row is not None else {}

    def _concurrently(self, requests: list[tuple[Any, Any]]) -> list[Any]:
        futures = [self._session.execute_async(statement, params)
                   for statement, params in requests]
        return [future.result() for future in futures]

    def _call(self, what: str, request: Callable[[], T]) -> T:
        """Run ``request`` with retries; each attempt counts as a round trip."""
        return retry(self._table, f"{what} of partition {self.partition}", request,
                     self._count_round_trips)


def _uncounted(_requests: int) -> None:
    """Requests not counted (the table's own, such as connecting)."""


def retry(table: CassandraTable, what: str, request: Callable[[], T],
          counted: Callable[[int], None] = _uncounted) -> T:
    """Run ``request`` (``retries.with_retries``: unreachable or timed-out failures
    retried, then ``StoreUnavailableError``); other driver errors raise ``StoreError``.
    ``counted`` hears the requests made."""
    what = f"{what} of table {table.keyspace}.{table.table}"
    try:
        return with_retries(table, request, retriable=_RETRIABLE, where=table.address,
                            what=what, counted=counted)
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"{table.address}: {what} failed: {type(exc).__name__}: {exc}") \
            from exc


def _batch(kind: Any, statements: Iterable[tuple[Any, Any]]) -> Any:
    batch = BatchStatement(kind)
    for statement, params in statements:
        batch.add(statement, params)
    return batch


def _identifier(field: str, name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{field} {name!r} is not a CQL identifier "
                         f"(letters, digits, '_', at most 48)")
    return name.lower()


def _consistency(field: str, name: str) -> int:
    try:
        level: int = ConsistencyLevel.name_to_value[name.upper()]
    except KeyError:
        names = ", ".join(sorted(ConsistencyLevel.name_to_value))
        raise ValueError(f"{field} {name!r} is not one of {names}") from None
    return level
