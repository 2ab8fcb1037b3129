"""Co-partitioned inputs aligned by timestamp: which gathered records a batch takes and
which it holds for the next one. Chosen once at start: ``UNALIGNED`` (one input topic,
or ``Config.max_task_idle=None``) takes everything; ``TimestampAlignment`` cuts each
partition number at a common timestamp frontier, as Kafka Streams' ``PartitionGroup``,
and reports what it waited for and holds (``AlignmentReport``) to whoever reads it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from kasper_py.message import TopicPartitionKey

__all__ = ["SLOW_FETCH", "UNALIGNED", "WAIT_REASONS", "Alignment", "AlignmentReport",
           "TimestampAlignment", "consumer_lags"]

SLOW_FETCH = 5.0
"""Seconds a partition number waits for an input whose lag is known (records on the
broker, none fetched yet) or not yet known (no fetch answered) before the wait is logged
as a warning (``kasper.alignment_waiting``). The wait itself has no bound: records that
may be earlier than the others are never passed over (Kafka Streams' rule)."""

Lags = Callable[[Collection[TopicPartitionKey]], dict[TopicPartitionKey, int | None]]
"""Records left on the broker per topic-partition (``None``: not known yet)."""

WAIT_REASONS = ("records_on_broker", "lag_unknown", "max_task_idle")
"""Why a partition number waits for an input with nothing gathered: records of it are
known to wait on the broker (its lag is above 0), its lag is not known yet (no fetch
answered), or it is caught up and ``max_task_idle`` is not over."""

_log = structlog.get_logger("kasper_py")


@dataclass(frozen=True)
class AlignmentReport:
    """What a ``TimestampAlignment`` waited for and holds, as of its last cut. Made anew
    by each cut and never changed, so another thread (a metrics scrape) may read it."""

    enforced: Mapping[TopicPartitionKey, int]
    """Per input, the ``max_task_idle`` waits on it that ended with its partition number
    going on without it (Kafka Streams' enforced processing)."""
    waited: Mapping[tuple[TopicPartitionKey, str], float]
    """Seconds its partition number waited for each input with nothing gathered, by
    reason (``WAIT_REASONS``): from the cut that found the wait to the cut that found it
    over (or the last cut, while it lasts)."""
    held: Mapping[TopicPartitionKey, int]
    """Records of each aligned topic-partition read so far that the last cut held for the
    next batch (0 once none are)."""
    held_back: frozenset[TopicPartitionKey]
    """Topic-partitions not fetched for now: a batch's worth of their records held."""


NO_REPORT = AlignmentReport({}, {}, {}, frozenset())


class Fetching(Protocol):
    """Which input partitions the consumer fetches (``ports.InputPort``'s two methods)."""

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch no more of ``keys`` for now; each stays after its last record read."""

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        """Fetch the keys held back again, from where reading stopped."""


class _FetchAll:
    """Every partition fetched all along (no consumer to tell: a test's script)."""

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        pass

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        pass


class Alignment(Protocol):
    """Splits the gathered records into the batch's and those held for the next batch."""

    def cut(self, records: list[Any]) -> tuple[list[Any], list[Any]]:
        """(released, held), each in the order gathered."""

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        """``keys`` were revoked: forget what was learned of them."""


def runs_until(records: Sequence[Any], stamps: Sequence[tuple[TopicPartitionKey, float] | None],
               limit: Callable[[TopicPartitionKey], float],
               most: int | None = None) -> tuple[list[Any], list[Any]]:
    """(taken, rest), each in the order of ``records``: each topic-partition's records
    are taken from its first on, until one is stamped past ``limit(key)`` or ``most``
    are taken; that one and every later one of its topic-partition are the rest, so what
    is taken of each is a run of offsets. A record stamped ``None`` is always taken."""
    taken: list[Any] = []
    rest: list[Any] = []
    stopped: set[TopicPartitionKey] = set()
    room = len(records) if most is None else most
    for record, stamp in zip(records, stamps, strict=True):
        if stamp is not None and (stamp[0] in stopped or stamp[1] > limit(stamp[0])
                                  or len(taken) >= room):
            stopped.add(stamp[0])
            rest.append(record)
        else:
            taken.append(record)
    return taken, rest


class _Unaligned:
    """Every gathered record goes in the batch (one input topic, or alignment off)."""

    def cut(self, records: list[Any]) -> tuple[list[Any], list[Any]]:
        return records, []

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        pass


UNALIGNED: Alignment = _Unaligned()


class TimestampAlignment:
    """Partition number P's batch ends at frontier(P): the lowest, over the aligned
    topics T, of the newest timestamp gathered of (T, P). A (T, P) with nothing gathered
    sets it to minus infinity (all of P waits) as Kafka Streams' ``PartitionGroup``
    decides: while records of it may wait on the broker (its lag is above 0, or not yet
    known: no fetch answered), with no time bound, since they may be earlier than P's
    others (logged once past ``SLOW_FETCH`` seconds); once it is known caught up, for
    ``max_task_idle`` seconds (0: not at all), then P goes on without it, logged
    (``kasper.alignment_enforced``), until it brings records again. A (T, P) is held
    from its first record past the frontier on, so every batch takes a contiguous run of
    offsets of each topic-partition and commits none past a held record. Memory stays
    bounded as in Kafka Streams (``buffered.records.per.partition``): a topic-partition
    with ``most`` records held or more is not fetched (``fetching.hold_back``) until
    fewer are held; nothing is released for it. What it waited for and holds is in
    ``report()``."""

    def __init__(self, topics: Collection[str], lags: Lags, clock: Callable[[], float],
                 max_task_idle: float, most: int, *, fetching: Fetching | None = None) -> None:
        self._topics, self._lags, self._clock = frozenset(topics), lags, clock
        self._max_idle, self._most = max_task_idle, most
        self._fetching = fetching or _FetchAll()
        self._held_back: set[TopicPartitionKey] = set()
        """Topic-partitions not fetched for now: ``most`` of their records held."""
        self._awaited: dict[TopicPartitionKey, float] = {}
        """Since when each input P waits for (nothing gathered of it) has held P back with
        records maybe on the broker (its lag above 0 or not known)."""
        self._idle: dict[TopicPartitionKey, float] = {}
        """Since when each input P waits for has held P back known caught up."""
        self._expired: set[TopicPartitionKey] = set()
        """Caught-up inputs waited for ``max_task_idle``: they hold nothing back until
        they bring records again, or records of them wait on the broker."""
        self._warned: set[TopicPartitionKey] = set()
        """Inputs whose wait for records on the broker was logged as slow."""
        self._waits: dict[TopicPartitionKey, str] = {}
        """The inputs the last cut found holding their partition back, and why."""
        self._waits_at = 0.0
        """When the last cut found ``_waits`` (on ``clock``)."""
        self._enforced: Counter[TopicPartitionKey] = Counter()
        self._waited: defaultdict[tuple[TopicPartitionKey, str], float] = defaultdict(float)
        self._report = NO_REPORT

    def cut(self, records: list[Any]) -> tuple[list[Any], list[Any]]:
        if not records:
            self._tally({}, None)
            self._publish({}, {})
            return records, []
        stamps = self._stamps(records)
        newest: dict[TopicPartitionKey, float] = {}
        for key, timestamp in filter(None, stamps):
            if timestamp > newest.get(key, -math.inf):
                newest[key] = timestamp
        frontiers = self._frontiers(newest)
        released, held = runs_until(records, stamps, lambda key: frontiers[key[1]])
        counts = Counter((record.topic(), record.partition()) for record in held)
        self._bound(counts)
        self._publish(newest, counts)
        return released, held

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        keys = set(keys)
        self._fetching.read_on(keys & self._held_back)
        self._held_back -= keys
        for key in keys:
            self._awaited.pop(key, None)
            self._idle.pop(key, None)
            self._expired.discard(key)
            self._warned.discard(key)
            self._waits.pop(key, None)
        held = {key: count for key, count in self._report.held.items() if key not in keys}
        self._report = replace(self._report, held=held, held_back=frozenset(self._held_back))

    def report(self) -> AlignmentReport:
        """What was waited for so far, and what the last cut held (any thread)."""
        return self._report

    def _publish(self, gathered: Iterable[TopicPartitionKey],
                 counts: Mapping[TopicPartitionKey, int]) -> None:
        """The report of this cut: every topic-partition gathered now or held before
        shows what it holds now (0: nothing)."""
        held = dict.fromkeys(self._report.held, 0)
        held.update(dict.fromkeys(gathered, 0))
        held.update(counts)
        self._report = AlignmentReport(dict(self._enforced), dict(self._waited), held,
                                       frozenset(self._held_back))

    def _tally(self, waits: dict[TopicPartitionKey, str], now: float | None) -> None:
        """Count the seconds from the last cut to this one (at ``now``, read here when
        ``None``) to each wait the last cut found; keep this cut's ``waits``, counted
        from 0 s."""
        if self._waits:
            now = self._clock() if now is None else now
            elapsed = now - self._waits_at
            for key, reason in self._waits.items():
                self._waited[key, reason] += elapsed
        for key, reason in waits.items():  # shown from the cut that finds it on
            self._waited.setdefault((key, reason), 0.0)
        self._waits = waits
        if now is not None:
            self._waits_at = now

    def _bound(self, counts: Mapping[TopicPartitionKey, int]) -> None:
        """Hold back the fetch of each topic-partition with ``most`` records held or
        more (``counts``); read on those held back with fewer."""
        full = {key for key, count in counts.items() if count >= self._most}
        if full - self._held_back:
            _log.info("kasper.alignment_held_back", keys=sorted(full - self._held_back),
                      most=self._most)
            self._fetching.hold_back(full - self._held_back)
        if self._held_back - full:
            self._fetching.read_on(self._held_back - full)
        self._held_back = full

    def _stamps(self, records: Sequence[Any]) -> list[tuple[TopicPartitionKey, int] | None]:
        """Each record's topic-partition and timestamp; ``None`` for one that is never
        held (an error, a topic not aligned). Read once: each is a call into the client."""
        topics, stamps = self._topics, []
        for record in records:
            topic = None if record.error() is not None else record.topic()
            stamps.append(((topic, record.partition()), record.timestamp()[1])
                          if topic in topics else None)
        return stamps

    def _frontiers(self, newest: dict[TopicPartitionKey, float]) -> dict[int, float]:
        """frontier(P) of every partition number gathered (see the class)."""
        partitions = {p for _, p in newest}
        self._expired.difference_update(newest)  # it brought records: it may wait again
        missing = [(t, p) for t in self._topics for p in partitions if (t, p) not in newest]
        waiting = self._waiting(missing)
        frontiers = dict.fromkeys(partitions, math.inf)
        for (_, partition), timestamp in newest.items():
            frontiers[partition] = min(frontiers[partition], timestamp)
        for _, partition in waiting:
            frontiers[partition] = -math.inf
        return frontiers

    def _waiting(self, missing: list[TopicPartitionKey]) -> dict[TopicPartitionKey, str]:
        """Those of ``missing`` (nothing gathered) that hold their partition back now,
        and why (``WAIT_REASONS``). A wait ends when its partition has no records, or the
        input brings some."""
        awaited, idle, self._awaited, self._idle = self._awaited, self._idle, {}, {}
        if not missing:
            self._warned.clear()
            self._tally({}, None)
            return {}
        now, lags, waiting = self._clock(), self._lags(missing), {}
        for key in missing:
            lag = lags.get(key)  # not answered: not known, so not ruled out
            if lag != 0:  # records may wait on the broker: held, however long it takes
                self._expired.discard(key)
                self._awaited[key] = since = awaited.get(key, now)
                waiting[key] = "lag_unknown" if lag is None else "records_on_broker"
                self._slow(key, lag, now - since)
            elif key not in self._expired and self._idle_holds(key, idle.get(key, now), now):
                waiting[key] = "max_task_idle"
        self._warned.intersection_update(self._awaited)
        self._tally(waiting, now)
        return waiting

    def _idle_holds(self, key: TopicPartitionKey, since: float, now: float) -> bool:
        """Whether ``key``, known caught up since ``since``, still holds its partition
        back (``max_task_idle``). When that wait ends it is logged, and ``key`` holds
        nothing back until it brings records again."""
        if now - since < self._max_idle:
            self._idle[key] = since
            return True
        if self._max_idle > 0:
            self._expired.add(key)
            self._enforced[key] += 1
            _log.info("kasper.alignment_enforced", topic=key[0], partition=key[1],
                      waited=round(now - since, 3), max_task_idle=self._max_idle)
        return False

    def _slow(self, key: TopicPartitionKey, lag: int | None, waited: float) -> None:
        """Log once per wait that ``key``'s records were waited for ``SLOW_FETCH`` s."""
        if waited >= SLOW_FETCH and key not in self._warned:
            self._warned.add(key)
            _log.warning("kasper.alignment_waiting", topic=key[0], partition=key[1],
                         lag=lag, waited=round(waited, 3))


def consumer_lags(positions: Callable[[], dict[TopicPartitionKey, int | None]],
                  watermarks: Callable[[TopicPartitionKey, bool], tuple[int, int]]) -> Lags:
    """``Lags`` from a consumer's positions and cached high watermarks (read_committed:
    the last stable offset; a position is past the transaction markers once the fetch
    reached the end, ``InputConsumer.positions``): unknown until a fetch answered; an
    empty partition has none; an assigned partition not yet read from (no position) has
    an unknown lag; one not assigned has none."""

    def lags(keys: Collection[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        at = positions()
        result: dict[TopicPartitionKey, int | None] = {}
        for key in keys:
            if key not in at:
                result[key] = 0
                continue
            low, high = watermarks(key, True)
            position = at[key]
            if high < 0:
                result[key] = None
            elif position is None:
                result[key] = 0 if high <= max(low, 0) else None
            else:
                result[key] = max(high - position, 0)
        return result

    return lags
