"""``Tables``: the read-only queries of one TopicProcessor's tables, from any thread.

Reads go to the stores' query path (``Queryable.query_get_many``/``query_scan``), a
windowed table's through its ``WindowedQueryable``:
committed state, never the turn's pending writes, with no lock the loop waits on
longer than one read. A key is answered where its partition is open; elsewhere the
answer is ``NotHereError`` naming the instance that announced it holds the partition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import (
    BadQueryError,
    KeyNotFoundError,
    NotHereError,
    QueryUnavailableError,
    SerdeError,
    UnknownTableError,
)
from kasper_py.query._locate import Locator
from kasper_py.query._partitioner import PARTITIONERS, PRODUCERS, Partitioner, partition_for
from kasper_py.serdes import Serde, serde_for
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import Queryable, Scan, WarmStores
from kasper_py.windows.table import WindowedQueryable, WindowResult

__all__ = ["MAX_LIMIT", "Lookup", "Tables", "WarmElsewhere"]

_log = structlog.get_logger("kasper_py")

MAX_LIMIT = 10_000
"""The most pairs one scan page returns."""
WarmElsewhere = Callable[[int], Sequence[str]]
"""The query endpoints of the instances keeping an input partition warm, first choice
first (group mode: ``loop.standby_placement.WarmEndpoints``)."""
OpenStores = Callable[[], Mapping[int, Mapping[str, Queryable]]]
"""The stores open right now, by partition (the loop's, read from another thread), each
as queries read it: a windowed table's as its ``WindowedQueryable``."""


class Lookup(NamedTuple):
    """A key's value, and a ``hint`` when the key was not where
    ``Config.query_partitioner`` puts it (``Tables.find``); ``standby_lag``: answered by
    a standby's warm copy this many changelog offsets behind its owner's."""

    value: Any
    hint: str | None
    standby_lag: int | None = None


class Tables:
    """The queryable tables of one processor: ``get``, ``scan``, ``windows``, ``describe``.
    A view receives this object."""

    def __init__(self, config: Config, specs: Sequence[StoreSpec], open_stores: OpenStores,
                 locator: Locator | None = None,
                 partition_count: Callable[[], int | None] = lambda: None, *,
                 warm: WarmStores = dict,
                 stage_count: Callable[[str], int | None] = lambda _table: None,
                 warm_elsewhere: WarmElsewhere = lambda _partition: ()) -> None:
        """``partition_count`` gives the partitions of the input topics, ``None`` until
        the loop knows them (it started); ``warm`` the standby copies kept here;
        ``stage_count`` the partitions of the topics a table's stage reads, where they
        are fewer (an app's stage with its own count; ``None``: the input topics');
        ``warm_elsewhere`` the endpoints of the instances keeping a partition warm."""
        self.config = config
        self._warm_elsewhere = warm_elsewhere
        self._stage_count = stage_count
        self._warm = warm
        self._specs = {spec.name: spec for spec in specs}
        self._open_stores = open_stores
        self._locator = locator
        self._partition_count = partition_count
        self._warned = False

    @property
    def partition_count(self) -> int | None:
        """Partitions of the input topics; known once the loop started."""
        return self._partition_count()

    # -- what is here -------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """Per table: name, backend, kind (``table``, ``global``, ``windowed``), key and
        value serde names, the partitions open here, and whether scans are ordered."""
        held = self._held()
        return [self._description(spec, held) for spec in self._specs.values()]

    def _description(self, spec: StoreSpec, held: Mapping[int, Mapping[str, Queryable]]
                     ) -> dict[str, Any]:
        stores = [stores[spec.name] for stores in held.values() if spec.name in stores]
        windowed = next((s for s in stores if isinstance(s, WindowedQueryable)), None)
        key_serde, value_serde = ((windowed.key_serde, windowed.value_serde) if windowed
                                  else (_serde(spec, "key_serde"), _serde(spec, "value_serde")))
        kind = "windowed" if windowed else "global" if _everywhere(spec) else "table"
        return {"name": spec.name, "backend": type(spec).__name__, "kind": kind,
                "key_serde": getattr(key_serde, "name", None),
                "value_serde": getattr(value_serde, "name", None),
                "partitions": sorted(p for p, s in held.items() if spec.name in s),
                "ordered_scans": type(spec).__name__ != "RedisTable"}

    # -- reads ------------------------------------------------------------------------

    def key_of(self, table: str, raw: bytes) -> Any:
        """The key whose key-serde bytes are ``raw`` (a URL's key segment): the text of a
        ``str`` key, JSON text for ``json`` keys (``42``, ``"alice"``), bytes as they are."""
        serde = self.key_serde(table)
        try:
            return serde.decode(raw)
        except SerdeError as exc:
            raise BadQueryError(f"key {raw!r} of table {table!r} does not decode with its "
                                f"key serde {getattr(serde, 'name', serde)!r}: {exc}"
                                + _json_hint(serde, raw)) from exc

    def key_serde(self, table: str) -> Serde:
        """The serde of ``table``'s keys (a windowed table's: its ``WindowedTable``'s)."""
        spec = self._spec(table)
        for stores in self._held().values():
            store = stores.get(table)
            if isinstance(store, WindowedQueryable):
                return store.key_serde
        serde = _serde(spec, "key_serde")
        if serde is None:
            raise BadQueryError(f"table {table!r} ({type(spec).__name__}) declares no key serde")
        return serde

    def get(self, table: str, key: Any, *, partition: int | None = None) -> Any:
        """The committed value of ``key``; ``KeyNotFoundError`` when there is none,
        ``NotHereError`` when another instance holds its partition."""
        return self.find(table, key, partition=partition).value

    def find(self, table: str, key: Any, *, partition: int | None = None,
             stale: bool = False) -> Lookup:
        """``get``, with a hint when the key was found only in the partition another
        partitioner gives it (its producers do not partition as
        ``Config.query_partitioner`` says): a key is looked for under every partitioner
        whose partition is held here, so a default setup answers whichever one the
        input's producers used. A miss names the partitions looked in and the setting."""
        spec = self._spec(table)
        held = {p: s[table] for p, s in self._held().items() if table in s}
        if partition is not None or (_everywhere(spec) and held):
            store, partition = self._store_for(table, key, partition)
            found = store.query_get_many([key])
            if key not in found:
                raise KeyNotFoundError(f"table {table!r} has no value for key {key!r} in "
                                       f"input partition {partition}")
            return Lookup(found[key], None)
        home = self.partition_of(table, key)
        others = self._other_partitions(table, key, home)
        for where in (home, *others.values()):
            found = held[where].query_get_many([key]) if where in held else {}
            if key in found:
                return Lookup(found[key], None if where == home
                              else self._found_elsewhere(key, home, where, others))
        if home not in held:
            return self._from_standby(table, key, home, stale)
        raise KeyNotFoundError(f"table {table!r} has no value for key {key!r}"
                               + self._miss_hint(home, others, held))

    def _from_standby(self, table: str, key: Any, home: int, stale: bool) -> Lookup:
        """With ``stale``, a standby's warm copy of ``home`` answers, with its lag: this
        instance's, else ``NotHereError`` names the instance keeping it warm (an instance
        placed to keep it warm that has no copy yet names the owner, so a stale lookup
        is sent on once at most). Otherwise ``NotHereError`` names the owner."""
        copy = self._warm().get(home, {}).get(table) if stale else None
        if copy is None:
            warm = list(self._warm_elsewhere(home)) if stale else []
            own = self._locator.own_endpoint if self._locator is not None else None
            if warm and own not in warm:
                raise NotHereError(f"key {key!r} of table {table!r} is in input partition "
                                   f"{home}, kept warm by {warm[0]}", partition=home,
                                   endpoint=warm[0])
            raise self._not_here(table, home, key)
        found = copy.query_get_many([key])
        if key not in found:
            raise KeyNotFoundError(f"table {table!r} has no value for key {key!r} in the "
                                   f"standby copy of input partition {home}, "
                                   f"{copy.lag} changelog offsets behind its owner's",
                                   standby_lag=copy.lag)
        return Lookup(found[key], None, copy.lag)

    def _other_partitions(self, table: str, key: Any, home: int) -> dict[Partitioner, int]:
        """The partition each partitioner but the configured one gives ``key``, where it
        differs from ``home``."""
        count = self.keys_partitions(table)
        assert count is not None  # partition_of checked it
        encoded = bytes(self.key_serde(table).encode(key) or b"")
        others: dict[Partitioner, int] = {}
        for partitioner in PARTITIONERS:
            if partitioner == self.config.query_partitioner:
                continue
            try:
                other = partition_for(encoded, count, partitioner)
            except ValueError:  # an empty key has no crc32 home
                continue
            if other != home:
                others[partitioner] = other
        return others

    def _found_elsewhere(self, key: Any, home: int, where: int,
                         others: Mapping[Partitioner, int]) -> str:
        partitioner = next(p for p, other in others.items() if other == where)
        hint = (f"key {key!r} was found in input partition {where}, where the "
                f"{partitioner} partitioner ({PRODUCERS[partitioner]}) puts it, not in "
                f"partition {home} (query_partitioner={self.config.query_partitioner!r}): "
                + _setting_hint(partitioner))
        if not self._warned:
            self._warned = True
            _log.warning("kasper.query_partitioner_mismatch", processor=self.config.name,
                         hint=hint)
        return hint

    def _miss_hint(self, home: int, others: Mapping[Partitioner, int],
                   held: Mapping[int, Queryable]) -> str:
        """Where the key was looked for and, when another partitioner's partition is held
        elsewhere, the setting that would route the key there."""
        looked = [f"{home} ({self.config.query_partitioner})"]
        looked += [f"{other} ({name})" for name, other in others.items() if other in held]
        hint = f" (looked in input partition {' and '.join(looked)})"
        elsewhere = [(name, other) for name, other in others.items() if other not in held]
        for name, other in elsewhere:
            hint += (f"; if the input's producers use the {name} partitioner "
                     f"({PRODUCERS[name]}), the key is in partition {other}, not held "
                     f"here: {_setting_hint(name)}")
        return hint

    def windows(self, table: str, key: Any, time_from: int = 0,
                time_to: int = 2 ** 63 - 1) -> list[WindowResult]:
        """The committed windows of ``key`` overlapping ``[time_from, time_to]`` (ms),
        earliest first; ``BadQueryError`` when ``table`` keeps no ``WindowedTable``."""
        store, _ = self._store_for(table, key, None)
        if not isinstance(store, WindowedQueryable):
            raise BadQueryError(f"table {table!r} holds no WindowedTable: query its keys "
                                "without from= and to=")
        if time_from > time_to:
            raise BadQueryError(f"from={time_from} is after to={time_to}")
        return store.query_windows(key, time_from, time_to)

    def scan(self, table: str, scan: Scan, *, partition: int | None = None
             ) -> dict[str, Any]:
        """One page of ``table`` over the partitions open here (or ``partition``), one
        partition after the other: ``{"items": [[key, value, partition], ...],
        "cursor": str | None, "ordered": bool}``. Ordered means in key-byte order within
        each partition."""
        spec = self._spec(table)
        if not 1 <= scan.limit <= MAX_LIMIT:
            raise BadQueryError(f"limit must be 1..{MAX_LIMIT}, got {scan.limit}")
        held = {p: s[table] for p, s in sorted(self._held().items()) if table in s}
        if any(isinstance(store, WindowedQueryable) for store in held.values()):
            raise BadQueryError(f"table {table!r} is windowed: read a key's windows at "
                                f"/tables/{table}/<key>?from=<ms>&to=<ms>")
        if _everywhere(spec):
            held = dict(list(held.items())[:1])  # every store reads the same data
        elif partition is not None:
            self._check_partition(partition)
            if partition not in held:
                raise self._not_here(table, partition, None)
            held = {partition: held[partition]}
        return _scan_partitions(held, scan)

    # -- where ------------------------------------------------------------------------

    def _store_for(self, table: str, key: Any, partition: int | None
                   ) -> tuple[Queryable, int]:
        spec = self._spec(table)
        held = {p: s[table] for p, s in self._held().items() if table in s}
        if _everywhere(spec) and held:
            partition, store = next(iter(held.items()))
            return store, partition
        if partition is None:
            partition = self.partition_of(table, key)
        else:
            self._check_partition(partition)
        if partition in held:
            return held[partition], partition
        raise self._not_here(table, partition, key)

    def keys_partitions(self, table: str) -> int | None:
        """How many partitions ``table``'s keys are spread over: those of the topics its
        stage reads (fewer than the input topics' largest count for an app's stage with
        its own count); ``None`` until the loop knows them."""
        return self._stage_count(table) or self.partition_count

    def partition_of(self, table: str, key: Any) -> int:
        """The input partition of ``key``: its key-serde bytes through
        ``Config.query_partitioner``, as the input's producers placed it, over the
        partitions of the topics ``table``'s stage reads (``keys_partitions``)."""
        count = self.keys_partitions(table)
        if count is None:
            raise QueryUnavailableError(f"processor {self.config.name!r} has not started: "
                                        "the input's partition count is not known yet")
        encoded = self.key_serde(table).encode(key)
        try:
            return partition_for(bytes(encoded or b""), count, self.config.query_partitioner)
        except ValueError as exc:
            raise BadQueryError(f"key {key!r}: {exc}") from exc

    def _check_partition(self, partition: int) -> None:
        """``BadQueryError`` for a ``partition`` the input topics do not have (negative,
        or past their count once the loop knows it): a bad parameter, not a partition
        held elsewhere."""
        count = self.partition_count
        if partition < 0 or (count is not None and partition >= count):
            valid = f"0..{count - 1}" if count is not None else "0 and up"
            raise BadQueryError(f"parameter partition={partition} is out of range: the "
                                f"input partitions of processor {self.config.name!r} are "
                                f"{valid}")

    def _not_here(self, table: str, partition: int, key: Any) -> NotHereError:
        endpoint = None
        if self._locator is not None and self.partition_count is not None:
            endpoint = self._locator.endpoint(partition, self.partition_count)
        what = f"key {key!r} of table {table!r} is in" if key is not None else "table " \
            f"{table!r}:"
        where = f"held by {endpoint}" if endpoint else (
            "not held here, and no running instance announced an endpoint for it (its "
            "owner has no metrics_port, is not running, or has not committed yet)")
        return NotHereError(f"{what} input partition {partition} "
                            f"({self.config.query_partitioner} partitioner), {where}",
                            partition=partition, endpoint=endpoint)

    def _spec(self, table: str) -> StoreSpec:
        spec = self._specs.get(table)
        if spec is None:
            raise UnknownTableError(f"no table {table!r} on processor {self.config.name!r}; "
                                    f"its tables: {sorted(self._specs)}")
        return spec

    def _held(self) -> Mapping[int, Mapping[str, Queryable]]:
        return self._open_stores()


def _scan_partitions(held: Mapping[int, Queryable], scan: Scan) -> dict[str, Any]:
    """Pages of each partition in turn; the cursor is ``<partition>:<store cursor>``."""
    first, inner = _split_cursor(scan.cursor)
    items: list[list[Any]] = []
    ordered = True
    partitions = [p for p in held if p >= first]
    for index, partition in enumerate(partitions):
        limit = scan.limit - len(items)
        try:
            page = held[partition].query_scan(Scan(
                scan.prefix, scan.start, scan.end,
                inner if partition == first else None, limit))
        except ValueError as exc:
            raise BadQueryError(f"bad cursor {scan.cursor!r}: {exc}") from exc
        ordered = ordered and page.ordered
        items += [[key, value, partition] for key, value in page.items]
        if page.cursor is not None:
            return {"items": items, "cursor": f"{partition}:{page.cursor}", "ordered": ordered}
        if len(items) >= scan.limit and index + 1 < len(partitions):
            return {"items": items, "cursor": f"{partitions[index + 1]}:",
                    "ordered": ordered}
    return {"items": items, "cursor": None, "ordered": ordered}


def _split_cursor(cursor: str | None) -> tuple[int, str | None]:
    if cursor is None:
        return -1, None
    partition, _, inner = cursor.partition(":")
    if not partition.isdigit():
        raise BadQueryError(f"bad cursor {cursor!r}: pass back the cursor a page returned")
    return int(partition), inner or None


def _everywhere(spec: StoreSpec) -> bool:
    """True for tables every instance holds whole: global tables, shared Redis tables."""
    return bool(getattr(spec, "global_table", False) or getattr(spec, "shared", False))


def _serde(spec: StoreSpec, what: str) -> Serde | None:
    serde = getattr(spec, what, None)
    return None if serde is None else serde_for(serde)


def _setting_hint(partitioner: Partitioner) -> str:
    return (f"set query_partitioner = \"{partitioner}\" (TOML, "
            f"KASPER_QUERY_PARTITIONER={partitioner} or Config(query_partitioner=...))")


def _json_hint(serde: Serde, raw: bytes) -> str:
    if getattr(serde, "name", None) != "json":
        return ""
    return (f"; json keys are written as JSON text: a string in quotes "
            f"(\"{raw.decode(errors='replace')}\", %22...%22 in a URL), a number as digits")
