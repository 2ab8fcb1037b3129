"""How many records the next batch may take, and how long it lingers for more: Kasper's
fixed batches (``Config.max_latency=None``), or a ``BatchController`` sizing each batch
from the last turns for a latency target. Pure rules, fed what each turn saw; the
``batching.Collector`` gathers the records, the loop's prefetcher wires the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["BACKLOG_TURN", "BatchController", "CoalescingProbe", "FixedBatches", "SampledBytes",
           "Sizing"]


class Sizing(Protocol):
    """What the prefetcher asks of a batch-sizing rule, chosen once at start."""

    @property
    def size(self) -> int:
        """Records the next batch may take."""

    @property
    def linger(self) -> float | None:
        """Seconds a batch waits for more once its first record is in; ``None``: it
        waits out ``batch_wait`` from its first consume."""

    @property
    def max_bytes(self) -> int | None:
        """Bytes of keys and values at which a batch is released; ``None``: no bound."""

    def observe(self, taken: int, waiting: int | None, seconds: float,
                produced: int | None = None) -> int:
        """Learn from a finished turn (``produced``: the outputs it sent, when known);
        the next batch's size."""

    def weigh(self, records: int, nbytes: int) -> None:
        """``records`` read held ``nbytes`` bytes of keys and values."""


class FixedBatches:
    """Kasper's classic batches: ``size`` records or ``batch_wait``, whichever comes
    first, every time; nothing is learned."""

    linger = None
    max_bytes = None

    def __init__(self, size: int) -> None:
        self.size = size

    def observe(self, taken: int, waiting: int | None, seconds: float,
                produced: int | None = None) -> int:
        return self.size

    def weigh(self, records: int, nbytes: int) -> None:
        pass


class BatchController:
    """Sizes batches for ``Config.max_latency``: a pure rule fed with what each turn saw
    (records taken and waiting, seconds, bytes read; no client, no clock), consulted by
    the loop before each batch.

    - Input backs up (a turn took a full batch, or more records wait than a batch
      holds): the batch doubles, or jumps to what waits, up to its ``ceiling``: the
      records a turn processes in ``BACKLOG_TURN`` targets at the last turn's pace, at
      most ``largest`` records and ``largest_bytes`` bytes (at the input's recent bytes
      per record). Latency is lost to the backlog anyway; bigger batches drain it
      sooner, and a turn stays short enough to hand the loop back to light input.
    - A turn slower than half the target, with no backlog: the next batch is half the
      last one (a slow processor or store must not hold a large batch back).
    - Light input: the batch shrinks, by half a turn at most, toward twice what the
      last turn took (room for a burst), never under ``smallest``.
    - A backlog whose batches would hold more than ``LOCALITY_BYTES`` in the loop
      (``locality``): they stop there, unless they coalesce (``CoalescingProbe``).

    ``linger``, how long a batch waits for more once its first record is in, is what
    the target leaves after two turns (a record may wait out the turn in hand, then
    its own), at most a tenth of the target, at least 0: take what has arrived.
    """

    def __init__(self, max_latency: float, largest: int, smallest: int = 100,
                 largest_bytes: int | None = None,
                 locality_bytes: int | None = None) -> None:
        """``locality_bytes``: the loop's memory for a batch past which a backlog's
        batches stop unless they coalesce (``locality``; ``LOCALITY_BYTES`` unless
        given)."""
        if not max_latency > 0:
            raise ValueError(f"max_latency must be positive seconds, got {max_latency!r}")
        if smallest < 1 or largest < 1 or (largest_bytes is not None and largest_bytes < 1):
            raise ValueError("batch bounds must be at least 1, got "
                             f"{smallest}..{largest} records, {largest_bytes} bytes")
        self.max_latency = max_latency
        self.largest = largest
        self.smallest = min(smallest, largest)
        self.max_bytes = largest_bytes
        self.locality_bytes = LOCALITY_BYTES if locality_bytes is None else locality_bytes
        self.size = self.smallest
        """The target: records the next batch may take."""
        self.turn_seconds: float | None = None
        """Recent turns' duration, smoothed (``None`` before the first)."""
        self.record_seconds: float | None = None
        """Seconds per record of the last turn that took any (``None`` before it)."""
        self.record_bytes: float | None = None
        """Bytes per record of the input, smoothed (``None`` before any is weighed)."""
        self.probe = CoalescingProbe()
        """Whether a backlog's batches past ``locality`` pay for their size."""

    @property
    def linger(self) -> float:
        """Seconds the next batch waits for more records once its first is in."""
        turn = self.turn_seconds or 0.0
        spare = self.max_latency / 2 - 2 * turn
        return max(0.0, min(self.max_latency / _LINGER_PARTS, spare))

    @property
    def ceiling(self) -> int:
        """The most records a batch may take now: ``largest``, less when the last turn's
        pace (never under ``smallest``) or the input's bytes per record (never under one
        record) allow fewer."""
        most = self.largest
        if self.record_seconds:
            paced = int(BACKLOG_TURN * self.max_latency / self.record_seconds)
            most = min(most, max(self.smallest, paced))
        if self.max_bytes is not None and self.record_bytes:
            most = min(most, max(1, int(self.max_bytes / self.record_bytes)))
        return most

    @property
    def locality(self) -> int | None:
        """The records a batch holds in ``locality_bytes`` of the loop's memory, at the
        input's recent bytes per record (never under ``smallest``); ``None`` before any
        record is weighed."""
        if self.record_bytes is None:
            return None
        held = int(self.locality_bytes / (self.record_bytes + RECORD_OVERHEAD))
        return max(self.smallest, held)

    def observe(self, taken: int, waiting: int | None, seconds: float,
                produced: int | None = None) -> int:
        """Learn from a finished turn: it took ``taken`` records, ``waiting`` more were
        known to wait behind them when it ended (``None``: not known), it lasted
        ``seconds`` and sent ``produced`` outputs (``None``: not known). Returns the next
        batch size (also ``size``)."""
        if self.turn_seconds is None:
            self.turn_seconds = seconds
        else:
            self.turn_seconds += _SMOOTHING * (seconds - self.turn_seconds)
        if taken:
            self.record_seconds = seconds / taken
        backlog = taken >= self.size or (waiting is not None and waiting > self.size)
        local = self.locality
        if backlog and produced is not None and local is not None:
            self.probe.record(taken, produced, local, self.ceiling)
        if backlog:
            self.size = max(2 * self.size, waiting or 0)
        elif seconds > self.max_latency / 2:
            self.size = taken // 2
        else:
            self.size = max(2 * taken, self.size // 2)
        self.size = min(self.ceiling, max(self.smallest, self.size))
        if backlog and self.probe.capped and local is not None:
            self.size = min(self.size, local)
        return self.size

    def weigh(self, records: int, nbytes: int) -> None:
        """Learn the input's bytes per record: ``records`` read held ``nbytes`` bytes."""
        if records:
            latest = nbytes / records
            if self.record_bytes is None:
                self.record_bytes = latest
            else:
                self.record_bytes += _SMOOTHING * (latest - self.record_bytes)


class CoalescingProbe:
    """Under a backlog, whether batches past the locality bound (``BatchController.
    locality``) pay for their size. Past it each record costs the loop more (its
    objects no longer stay in the CPU's caches between the steps of a turn); what a
    larger batch can win back is coalescing, where a processor sends one output per
    key and batch (a count, the streams DSL's record cache and combined repartitions),
    so that outputs grow slower than the batch. Whether they do is counted, not timed
    (a turn's time swings with the machine; its counts do not): ``_PROBE_TURNS`` full
    backlog turns at the ceiling, as many at the bound, and the batch stays at the
    ceiling only when its outputs per input are under ``_COALESCES`` of the bound's;
    ``_REPROBE_TURNS`` backlog turns later, they are counted again. A turn counts for
    the size it took (a batch read ahead was sized before the turn that asked)."""

    def __init__(self) -> None:
        self.capped = False
        """True while a backlog's batches are held to the locality bound."""
        self._counts: dict[bool, list[int]] = {False: [0, 0, 0], True: [0, 0, 0]}
        """Turns, inputs and outputs counted at each size (``capped``)."""
        self._until_probe = 0
        """Backlog turns until the two sizes are counted again (0: counting now)."""
        self.outputs_per_input: tuple[float, float] | None = None
        """The last comparison's outputs per input at the ceiling and at the bound."""

    def record(self, taken: int, produced: int, local: int, ceiling: int) -> None:
        """A backlog turn took ``taken`` records and sent ``produced`` outputs, the
        locality bound being ``local`` records and the ceiling ``ceiling``."""
        if 4 * ceiling <= 5 * local:
            return  # the bound is (about) the ceiling: nothing to choose
        if self._until_probe:
            self._until_probe -= 1
            self.capped = self._until_probe > 0 and self.capped
            return
        at = (False if 4 * taken > 5 * local else
              True if 4 * taken >= 3 * local else None)
        if at is not self.capped:
            return  # a batch of neither size, or of the size asked before
        counts = self._counts[at]
        counts[0] += 1
        counts[1] += taken
        counts[2] += produced
        if counts[0] < _PROBE_TURNS:
            return
        if not self.capped:
            self.capped = True
            return
        (_, full_in, full_out), (_, local_in, local_out) = self._counts.values()
        self.outputs_per_input = (full_out / full_in, local_out / local_in)
        self.capped = not full_out * local_in < _COALESCES * local_out * full_in
        self._counts = {False: [0, 0, 0], True: [0, 0, 0]}
        self._until_probe = _REPROBE_TURNS


RECORD_OVERHEAD = 500
"""Bytes the loop holds for a record besides its key and value bytes (tracemalloc,
10,000 consumed records of 100 bytes: 234 for confluent-kafka's message, 183 for the
decoded ``Message``, 80 for an output record)."""
LOCALITY_BYTES = 6 * 1024 * 1024
"""The loop's memory for one batch past which a backlog's batches stop growing unless
they coalesce. Measured (the loop thread's CPU per record, a passthrough on the 2-core
machine, classic batches alternated in one run): 100-byte records cost 1.17-1.64 s per
million in batches of 10,000 (6 MB held) against 1.47-1.91 in batches of 20,000
(12 MB), every step of the turn slower by a fifth to a third (consuming, decoding,
processing, producing); 1,000-byte records 0.30-0.35 s per 200,000 in batches of 1,000
to 5,000 (up to 7.5 MB) against 0.38-0.41 in batches of 10,000 (15 MB)."""
EXACTLY_ONCE_LOCALITY = 2
"""Under exactly-once the bound holds this many times ``LOCALITY_BYTES``: a transaction
adds 3-4 ms to each turn (registering its partitions, its end, a fifth more a message
produced), which larger batches spread. Measured (the passthrough of 100-byte records
under exactly-once, four runs each alternated, the 2-core machine): 449k-541k msg/s in
batches of 18,500 (median 535k) against 453k-529k in batches of 10,400 (median 497k)."""
_PROBE_TURNS = 2
"""Backlog turns counted at each size before the two are compared."""
_REPROBE_TURNS = 100
"""Backlog turns run at the size chosen before both are counted again."""
_COALESCES = 0.9
"""A batch at the ceiling stays there when its outputs per input are under this
fraction of the locality bound's (bench_defaults.py's word count, a 10,000-word
vocabulary over two partitions, each changed total sent once a batch: 0.73 at 20,000
lines against 0.86 at 11,574; a passthrough: 1.0 at both)."""

BACKLOG_TURN = 10
"""Under a backlog a turn may last up to this many times ``max_latency`` (0.5 s at the
default 50 ms), at the last turn's pace. It keeps a slow processor's turns short (at
1 ms a record, batches of 500: half Kasper's classic 1,000) and leaves room for work
whose cost per record falls as its batch grows (a word count sends each word's total
once a batch, so its pace on small batches is slow, which kept them small): measured
(bench_defaults.py, the 2-core machine under load, 2026-11-26), four targets held its
batches at 1,500 to 7,000 lines (0.59x the word count at batch_size=10,000); with ten
they grow to the largest batch (12,500 to 15,400 lines a turn on average, the ramp from
100 included: 0.92x to 1.49x)."""
_LINGER_PARTS = 10
"""The longest linger is ``max_latency`` divided by this: 5 ms at the default 50 ms.
Measured (bench_latency.py, 4 partitions, the defaults, a quiet 2-core machine,
2026-11-27, a tenth and a fifth alternated in one run, three rounds): at 1,000 msg/s
end-to-end p99 10.1-13.4 ms against 14.8-21.5 (the loop's share 8-9 against 13-14)
for 1.2-1.3x the loop process's CPU (2.2-2.5 s against 1.7-1.9 per 10 s); at 10,000
msg/s the loop's share 9-11 ms against 14-17 for 1.1-1.2x the CPU, the end-to-end
tail there being the paced producer's acks. A backlog's batches fill before any
linger ends, so they are unchanged."""
_SMOOTHING = 0.2
"""Weight of the newest turn in ``BatchController.turn_seconds`` (and of the newest
batch in ``record_bytes``)."""

_SAMPLE_EVERY = 8
"""``SampledBytes`` weighs one record in this many."""


class SampledBytes:
    """Weighs consumed records: the bytes of their keys, values and header values (a
    streams DSL's packed repartition record carries its records in one), estimated from
    every eighth one (weighing each cost the loop 3-6 % at 100-byte records; one in
    eight, under 1 %). Each call starts the sample one record further, so sizes that
    repeat every eight records are not missed call after call."""

    def __init__(self) -> None:
        self._phase = 0

    def __call__(self, records: Sequence[Any]) -> int:
        self._phase = (self._phase + 1) % _SAMPLE_EVERY
        sample = records[self._phase::_SAMPLE_EVERY] or records[:1]
        if not sample:
            return 0
        weighed = 0
        for record in sample:  # a plain loop: a light turn's sample is one record
            value, key, headers = record.value(), record.key(), record.headers()
            weighed += (len(value) if value else 0) + (len(key) if key else 0)
            if headers:
                weighed += sum(len(value) for _, value in headers if value)
        return weighed * len(records) // len(sample)
