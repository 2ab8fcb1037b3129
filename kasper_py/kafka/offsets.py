"""``OffsetTracker``: what has been committed per topic-partition, so a commit
that would move an offset backwards fails loudly instead of replaying silently; and
``CommitNote``, the commit metadata that tells operators' tools a loop (or a streaming
query, ``kasper_py.stream``) is running.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from confluent_kafka import KafkaError

from kasper_py.exceptions import OffsetError
from kasper_py.message import TopicPartitionKey

if TYPE_CHECKING:
    from kasper_py.config import Config

__all__ = [
    "GROUP_ACTIVE_ERRORS",
    "HEARTBEAT_SECONDS",
    "IDLE_GROUP_STATES",
    "CommitNote",
    "OffsetTracker",
    "PartitionProgress",
    "lowered",
    "partition_lag",
    "running_elsewhere",
    "running_loop",
    "running_window",
    "start_offset",
]

HEARTBEAT_SECONDS = 10.0
"""An idle loop re-commits its offsets (same offsets, fresh note) this often."""
_NOTE_PREFIX = "kasper/1"
_ENDPOINT = "endpoint="
_STANDBYS = "standby="
IDLE_GROUP_STATES = ("EMPTY", "DEAD", "UNKNOWN")
"""Consumer group states in which moving the group's offsets is safe (no members)."""
GROUP_ACTIVE_ERRORS = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
                       KafkaError.ILLEGAL_GENERATION, KafkaError.NON_EMPTY_GROUP)
"""Errors with which Kafka refuses an offset change because the group has members."""

NoteState = Literal["running", "stopped", "streaming", "released"]
"""``running``: a live loop; ``streaming``: a Spark streaming query; ``stopped``: either
stopped cleanly (a stream's partition set starts with ``STREAM_PREFIX``); ``released``:
a loop that runs on stopped running these partitions (``kasper standby release``)."""
STREAM_PREFIX = "stream:"
"""Starts the partition set of the notes a streaming query writes."""
_STATES: tuple[NoteState, ...] = ("running", "stopped", "streaming", "released")


class OffsetTracker:
    """Remembers the next offset to read that was last committed, per topic-partition."""

    def __init__(self) -> None:
        self._committed: dict[TopicPartitionKey, int] = {}

    def check(self, next_offsets: dict[TopicPartitionKey, int]) -> None:
        """Raise ``OffsetError`` if any offset is below what was committed before."""
        for (topic, partition), offset in next_offsets.items():
            previous = self._committed.get((topic, partition))
            if previous is not None and offset < previous:
                raise OffsetError(
                    f"refusing to commit {topic}[{partition}] offset {offset}: "
                    f"{previous} was already committed"
                )

    def mark_committed(self, next_offsets: dict[TopicPartitionKey, int]) -> None:
        """Record offsets that the broker accepted."""
        self._committed.update(next_offsets)

    def committed(self, topic: str, partition: int) -> int | None:
        """The next offset to read that this process committed last, or ``None``."""
        return self._committed.get((topic, partition))

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Drop what is known of ``keys`` (partitions revoked from this process)."""
        for key in keys:
            self._committed.pop(key, None)

    def all(self) -> dict[TopicPartitionKey, int]:
        """Every offset this process committed, by topic-partition."""
        return dict(self._committed)


@dataclass(frozen=True)
class CommitNote:
    """Stored as the metadata of every offset a loop commits. A loop with a static
    assignment never joins its consumer group, so the group looks empty while it runs;
    this note is how ``kasper offsets reset`` and the reprocessing handoff tell that a
    loop is running (it re-commits at least every ``HEARTBEAT_SECONDS`` and after every
    turn) or has stopped cleanly (its last commit says so). A Spark streaming query
    writes the same notes, ``streaming`` while it runs, with its partition set prefixed
    by ``STREAM_PREFIX``; both states count as running for every check."""

    state: NoteState
    at: float
    """Unix time of the commit, in seconds."""
    host: str
    pid: int
    partitions: str | None = None
    """The loop's partition set (``Config.partition_set``), when it said."""
    endpoint: str | None = None
    """The URL the loop answers queries on (``kasper_py.query``), when it serves them."""
    standbys: tuple[int, ...] = ()
    """The partitions the loop keeps warm when it commits (a static standby promoted no
    longer is one; released, it is one again)."""

    @classmethod
    def now(cls, state: NoteState, partitions: str | None = None,
            endpoint: str | None = None, standbys: Iterable[int] = ()) -> CommitNote:
        """A note for a commit made now by this process."""
        return cls(state, time.time(), socket.gethostname(), os.getpid(), partitions,
                   endpoint, tuple(sorted(standbys)))

    def encode(self) -> str:
        """``kasper/1 <state> <unix time> <host> <pid> [<partition set>]
        [standby=<p>,<p>] [endpoint=<url>]``."""
        text = f"{_NOTE_PREFIX} {self.state} {self.at:.3f} {self.host} {self.pid}"
        if self.partitions is not None:
            text = f"{text} {self.partitions}"
        if self.standbys:
            text = f"{text} {_STANDBYS}{','.join(map(str, self.standbys))}"
        return text if self.endpoint is None else f"{text} {_ENDPOINT}{self.endpoint}"

    def is_mine(self) -> bool:
        """True when this process wrote the note."""
        return self.host == socket.gethostname() and self.pid == os.getpid()

    def process_gone(self) -> bool:
        """True when the note's process is known to have ended: it ran on this host and
        no process with its pid exists (a killed loop's note still says running)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    @classmethod
    def decode(cls, metadata: str | None) -> CommitNote | None:
        """The note in a commit's metadata; ``None`` when another client committed."""
        parts = (metadata or "").split(" ")
        endpoint = standbys = None
        if len(parts) > 5 and parts[-1].startswith(_ENDPOINT):
            endpoint = parts.pop()[len(_ENDPOINT):]
        if len(parts) > 5 and parts[-1].startswith(_STANDBYS):
            standbys = parts.pop()[len(_STANDBYS):]
        if len(parts) not in (5, 6) or parts[0] != _NOTE_PREFIX or parts[1] not in _STATES:
            return None
        try:
            at, pid = float(parts[2]), int(parts[4])
            kept = tuple(int(p) for p in standbys.split(",")) if standbys else ()
        except ValueError:
            return None
        state = _STATES[_STATES.index(parts[1])]
        return cls(state, at, parts[3], pid, parts[5] if len(parts) == 6 else None, endpoint,
                   kept)

    @property
    def by_stream(self) -> bool:
        """True when a streaming query (``kasper_py.stream``) wrote the note."""
        return (self.partitions or "").startswith(STREAM_PREFIX)

    def running_within(self, window: float, now: float | None = None) -> bool:
        """True when a running loop or streaming query made this commit less than
        ``window`` seconds ago."""
        return self.state in ("running", "streaming") and (now or time.time()) - self.at < window

    def alive(self, window: float) -> bool:
        """``running_within(window)``, and its process not known to have ended: a loop or
        query that still runs (the start-up checks' test of another runner, and where
        ``kasper lag`` places a static loop)."""
        return self.running_within(window) and not self.process_gone()

    @property
    def runner(self) -> str:
        """``pid-12@host``: the process that wrote the note, in one word (a table's
        cell, as a group member's ``client-id@host``)."""
        return f"pid-{self.pid}@{self.host}"

    def describe(self, now: float | None = None) -> str:
        """``running on host (pid 12), committed 3 s ago`` for messages."""
        age = max((now or time.time()) - self.at, 0.0)
        where = "" if self.partitions is None else f" on partitions {self.partitions}"
        return (f"{self.state} on {self.host} (pid {self.pid}){where}, "
                f"committed {age:.0f} s ago")


def running_window(config: Config) -> float:
    """Seconds after its last commit that a loop which did not say it stopped counts as
    running: idle loops re-commit every HEARTBEAT_SECONDS, busy ones every turn, and a
    turn may wait up to ``delivery_timeout`` for its acks."""
    return 3 * HEARTBEAT_SECONDS + config.delivery_timeout + 2 * config.batch_wait


def running_loop(config: Config, notes: Iterable[CommitNote | None]) -> CommitNote | None:
    """The newest note of a loop that still counts as running, if any: moving the
    group's offsets under it would be undone by its next commit."""
    window = running_window(config)
    running = [note for note in notes if note is not None and note.running_within(window)]
    return max(running, key=lambda note: note.at) if running else None


def running_elsewhere(config: Config, notes: Iterable[CommitNote | None], *,
                      by_stream: bool = False) -> CommitNote | None:
    """``running_loop`` among the notes of other runners: leaves out this process's own
    notes of its kind (a stream's when ``by_stream``, else a loop's) and those of a
    process on this host that no longer exists (a killed loop's or driver's)."""
    window = running_window(config)
    live = [note for note in notes if note is not None and note.alive(window)
            and not (note.is_mine() and note.by_stream == by_stream)]
    return max(live, key=lambda note: note.at) if live else None


def lowered(committed: Mapping[TopicPartitionKey, int | None],
            below: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int | None]:
    """The committed offsets, each lowered to ``below``'s where that is lower (where a
    loop starts when an effectively-once store is behind the committed offsets)."""
    return {tp: offset if offset is None or tp not in below else min(offset, below[tp])
            for tp, offset in committed.items()}


def start_offset(next_offset: int | None, low: int, high: int, auto_offset_reset: str) -> int:
    """Where reading a partition starts: ``next_offset``, the committed one; where it is
    ``None`` (nothing committed) or below ``low`` (its records deleted since: retention,
    ``delete_records``), where ``auto_offset_reset`` points, as the consumer resets an
    offset out of range: the low watermark (``earliest``) or the high one."""
    if next_offset is not None and next_offset >= low:
        return next_offset
    return low if auto_offset_reset == "earliest" else high


def partition_lag(next_offset: int | None, low: int, high: int, auto_offset_reset: str) -> int:
    """Records left between ``next_offset`` and a partition's end, ``high``: its high
    watermark, which under ``read_committed`` is the last stable offset (past the last
    transaction's commit marker, so an offset committed after the last record of a
    transactional topic can stop one short of it). Where ``next_offset`` is ``None``
    (nothing committed) or deleted, counting starts where ``auto_offset_reset`` points
    (``start_offset``): records deleted are never read, so they are no lag."""
    return max(high - start_offset(next_offset, low, high, auto_offset_reset), 0)


@dataclass(frozen=True)
class PartitionProgress:
    """How far a group is in one partition: its committed next offset (``None`` when
    nothing is committed), the partition's watermarks and the commit's note."""

    topic: str
    partition: int
    committed: int | None
    low: int
    high: int
    note: CommitNote | None = None
    """Who made the committed offset's commit, when a kasper loop did."""

    @property
    def key(self) -> TopicPartitionKey:
        """``(topic, partition)``."""
        return self.topic, self.partition

    def start(self, auto_offset_reset: str) -> int:
        """Where reading starts: the committed offset, else ``auto_offset_reset``'s."""
        return start_offset(self.committed, self.low, self.high, auto_offset_reset)

    def lag(self, auto_offset_reset: str) -> int:
        """Messages left to process; from the reset policy when nothing is committed."""
        return partition_lag(self.committed, self.low, self.high, auto_offset_reset)
