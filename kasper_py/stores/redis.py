"""Redis-backed state (redis-py): ``RedisTable`` declares a table, ``RedisStore`` is one
partition's view of it. One batch costs one ``MGET`` per ``get_many`` and one
``MULTI``/``EXEC`` (or one ``EVALSHA``, effectively-once) per ``flush``.

Keys: ``<prefix>/<table>/<partition>/<key>``, or ``<prefix>/<table>/<key>`` for a shared
table; ``<prefix>`` is the processor name unless given. Values are the value serde's
bytes in plain Redis strings. Effectively-once tables keep the next input offset of each
topic in the hash ``<prefix>/<table>#offsets/<partition>`` (field = topic).

Queries share the table's connection pool (redis-py's client is thread-safe) and read
what turns flushed: a turn is flushed whole (``MULTI``/``EXEC``) before its outputs are
acked and its offsets committed, so a reader may see a turn that then fails and is
replayed from the last commit (its writes applied again). Redis keeps no key order, so
scans are ``SCAN ... MATCH <key prefix>*`` pages, unordered, and never by key range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
from kasper_py.stores.ttl import Ttl

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "kasper_py.stores.redis needs redis-py: pip install kasper-py[redis]") from exc

__all__ = ["RedisStore", "RedisTable"]

T = TypeVar("T")

# Applies one batch atomically with its input offsets, fenced on the offsets it expects.
# KEYS[1] offsets hash, then ARGV[1] keys to SET, then the keys to DEL.
# ARGV: n_set, n_offsets, the n_set values, then per topic: topic, expected, next; last
# the time to live in ms (0: none), set on each written key with PX.
# Replies 1 when applied, 0 when this batch was already applied (a retried call whose
# reply was lost), and an error when another writer moved the offsets.
_APPLY_BATCH = """
local n_set, n_off = tonumber(ARGV[1]), tonumber(ARGV[2])
local base = 2 + n_set
local done = n_off > 0
for i = 0, n_off - 1 do
  if redis.call('HGET', KEYS[1], ARGV[base + 3 * i + 1]) ~= ARGV[base + 3 * i + 3] then
    done = false
  end
end
if done then return 0 end
for i = 0, n_off - 1 do
  local topic, expected = ARGV[base + 3 * i + 1], ARGV[base + 3 * i + 2]
  local current = redis.call('HGET', KEYS[1], topic) or ''
  if current ~= expected then
    return redis.error_reply('kasper fenced: offset of ' .. topic .. ' is ' .. current ..
      ', expected ' .. expected .. '; another process writes this partition')
  end
end
local ttl = tonumber(ARGV[#ARGV])
for i = 1, n_set do
  if ttl > 0 then redis.call('SET', KEYS[1 + i], ARGV[2 + i], 'PX', ttl)
  else redis.call('SET', KEYS[1 + i], ARGV[2 + i]) end
end
for i = 2 + n_set, #KEYS do redis.call('DEL', KEYS[i]) end
for i = 0, n_off - 1 do
  redis.call('HSET', KEYS[1], ARGV[base + 3 * i + 1], ARGV[base + 3 * i + 3])
end
return 1
"""

_RETRIABLE = (redis.ConnectionError, redis.TimeoutError)


class RedisTable(StoreSpec):
    """Declares a Redis table ``name``; every partition's store shares one connection pool.

    ``shared=True`` drops the partition from keys, for tables whose keys are co-partitioned
    with the input (or only read). ``effectively_once=True`` stores each partition's
    input offsets atomically with its writes, so replayed input is skipped. Connection
    failures are retried ``retries`` times, backing off from ``backoff`` seconds doubling
    up to ``max_backoff``, then raise ``StoreUnavailableError``. ``ttl`` (seconds) sets
    Redis' own expiry on every key written (``SET ... PX``): a key lives that long after
    its last write, and Redis removes it.
    """

    def __init__(self, name: str, *, url: str = "redis://127.0.0.1:6379/0",
                 key_serde: str | Serde = "str", value_serde: str | Serde = "json",
                 prefix: str | None = None, shared: bool = False,
                 effectively_once: bool = False, retries: int = 5, backoff: float = 0.1,
                 max_backoff: float = 2.0, timeout: float = 5.0,
                 ttl: float | Ttl | None = None) -> None:
        if not name or "/" in name:
            raise ValueError(f"table name must be non-empty with no '/', got {name!r}")
        self.name = name
        self.url = url
        self.key_serde, self.value_serde = serde_for(key_serde), serde_for(value_serde)
        self.prefix = prefix
        self.shared = shared
        self.effectively_once = effectively_once
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.timeout = timeout
        self.ttl = Ttl.by_server(ttl, "a RedisTable")
        self._client: redis.Redis | None = None

    def open(self, runtime: StoreRuntime) -> RedisStore:
        """Return partition ``runtime.partition``'s store (effectively-once stores read
        their applied offsets here, with ``HGETALL``)."""
        if self._client is None:
            # Retries are ours (bounded, with backoff, counted), not the client's.
            self._client = redis.Redis.from_url(
                self.url, retry=Retry(NoBackoff(), 0), socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout)
        return RedisStore(self, self._client, runtime)

    def close(self) -> None:
        """Disconnect the pool."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def owned_state(self, config: Config) -> OwnedState:
        """Held in Redis: the keys ``<prefix>/<table>/*`` at ``address``."""
        prefix = self.prefix or config.name
        return OwnedState(external=f"Redis table {self.name!r}: keys {prefix}/{self.name}/* "
                          f"at {self.address}")

    @property
    def address(self) -> str:
        """The server's address, without credentials, for error messages."""
        return server_address(self.url, 6379)


def _glob_escape(raw: bytes) -> bytes:
    """``raw`` with Redis glob's special characters (``*?[]\\``) escaped for MATCH."""
    return bytes(b for c in raw for b in ((0x5C, c) if c in b"*?[]\\" else (c,)))


class RedisStore(BufferedStore):
    """One partition of a Redis table. Keys ``<prefix>/<table>/<partition>/<key>``
    (``<prefix>/<table>/<key>`` when shared), values the value serde's bytes."""

    def __init__(self, table: RedisTable, client: redis.Redis, runtime: StoreRuntime) -> None:
        self.processor, self.partition = runtime.config.name, runtime.partition
        prefix = table.prefix or self.processor
        scope = "" if table.shared else f"{self.partition}/"
        super().__init__(table.name, table.key_serde, table.value_serde, runtime.observer,
                         key_prefix=f"{prefix}/{table.name}/{scope}".encode())
        self.effectively_once = table.effectively_once
        self.offsets_key = f"{prefix}/{table.name}#offsets/{self.partition}"
        self._table, self._client = table, client
        self._ttl_ms = 0 if table.ttl is None else table.ttl.ms
        self._applied: dict[TopicPartitionKey, int] = {}
        if self.effectively_once:
            self._script = client.register_script(_APPLY_BATCH)
            self._applied = self._observed("open", self._read_offsets)

    def _read_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``MGET`` of the keys."""
        values: list[Any] = self._call("MGET", lambda: self._client.mget(keys))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def _write(self, writes: Writes, next_offsets: Mapping[TopicPartitionKey, int]) -> None:
        """One round trip: ``MULTI``, ``MSET`` (with a ttl, a ``SET ... PX`` per key),
        ``DEL``, ``EXEC``. Effectively-once: one
        ``EVALSHA`` of a script that applies the writes and ``HSET``s the offsets hash
        atomically, refusing if another writer moved it; nothing for a replayed batch
        (Redis holds its writes already)."""
        if not self.effectively_once:
            self._call("MULTI/EXEC", lambda: self._apply(writes))
        elif not already_applied(self._applied, next_offsets):
            self._call("EVALSHA", lambda: self._apply_with_offsets(writes, next_offsets))
            self._applied.update(next_offsets)

    def _query_read(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """One ``MGET`` on the shared pool, no retries (the caller may ask again)."""
        values: list[Any] = self._query_call("MGET", lambda: self._client.mget(keys))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def query_scan(self, scan: Scan) -> ScanPage:
        """``SCAN <cursor> MATCH <key prefix><scan prefix>* COUNT <limit>`` until ``limit``
        keys or the end, then one ``MGET`` of them. Unordered; a key may come twice
        across pages (Redis' SCAN guarantee); the cursor is Redis' own. Range scans
        (``start``/``end``) are refused: Redis keeps no key order to scan by."""
        scan.refuse_range("Redis", "Redis keeps no key order (SCAN walks its hash table)")
        pattern = _glob_escape(self._key_prefix + scan.prefix) + b"*"
        cursor, keys = int(scan.cursor or 0), []
        while True:
            cursor, found = self._scan_once(cursor, pattern, scan.limit)
            keys += found
            if cursor == 0 or len(keys) >= scan.limit:
                break
        values = self._query_read(keys) if keys else {}
        pairs = [(k, values[k]) for k in dict.fromkeys(keys) if k in values]
        return self.decoded_page(pairs, None if cursor == 0 else str(cursor), ordered=False)

    def _scan_once(self, cursor: int, pattern: bytes, count: int) -> tuple[int, list[bytes]]:
        reply: Any = self._query_call("SCAN", lambda: self._client.scan(
            cursor, match=pattern, count=count))
        return int(reply[0]), [bytes(k) for k in reply[1]]

    def _query_call(self, command: str, request: Callable[[], T]) -> T:
        try:
            return request()
        except _RETRIABLE as exc:
            raise QueryUnavailableError(f"redis {self._table.address} unreachable: {command} "
                                        f"for table {self._table.name!r} (waited up to "
                                        f"{self._table.timeout:g}s): {exc}") from exc
        except (redis.RedisError, AttributeError) as exc:  # AttributeError: pool closed
            raise QueryUnavailableError(f"redis {self._table.address}: {command} for table "
                                        f"{self._table.name!r} failed: {exc}") from exc

    def applied_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Next input offsets whose effects this partition already holds (``HGETALL``
        of the offsets hash when opened, then kept by ``flush``)."""
        return dict(self._applied)

    def _apply(self, writes: Writes) -> None:
        sets = {k: v for k, v in writes.items() if v is not None}
        deletes = [k for k, v in writes.items() if v is None]
        pipe = self._client.pipeline(transaction=True)
        if sets and self._ttl_ms:
            for key, value in sets.items():
                pipe.set(key, value, px=self._ttl_ms)
        elif sets:
            pipe.mset(sets)
        if deletes:
            pipe.delete(*deletes)
        pipe.execute()

    def _apply_with_offsets(self, writes: Writes,
                            next_offsets: Mapping[TopicPartitionKey, int]) -> Any:
        sets = [(k, v) for k, v in writes.items() if v is not None]
        deletes = [k for k, v in writes.items() if v is None]
        triples: list[Any] = []
        for (topic, partition), offset in next_offsets.items():
            expected = self._applied.get((topic, partition))
            triples += [topic, "" if expected is None else str(expected), str(offset)]
        keys = [self.offsets_key.encode(), *(k for k, _ in sets), *deletes]
        args = [len(sets), len(next_offsets), *(v for _, v in sets), *triples, self._ttl_ms]
        return self._script(keys=keys, args=args)

    def _read_offsets(self) -> dict[TopicPartitionKey, int]:
        stored: dict[Any, Any] = self._call(
            "HGETALL", lambda: self._client.hgetall(self.offsets_key))
        return {(bytes(topic).decode(), self.partition): int(offset)
                for topic, offset in stored.items()}

    def _call(self, command: str, request: Callable[[], T]) -> T:
        """Run ``request``, retrying connection failures with exponential backoff; each
        attempt counts as a round trip."""
        what = f"{command} for table {self._table.name!r} partition {self.partition}"
        try:
            return with_retries(self._table, request, retriable=_RETRIABLE,
                                where=f"redis {self._table.address}", what=what,
                                counted=self._count_round_trips)
        except redis.RedisError as exc:
            raise StoreError(f"redis {self._table.address}: {what} failed: {exc}") from exc
