"""The garbage collector's pace while batches are processed.

CPython collects its youngest generation every 700 net allocations of container
objects. A turn keeps a few objects per message alive at once (its batch, the batch
read ahead, their raw records and the output buffer), so at ``batch_size`` 10,000 the
collector ran about 4,000 times per million messages and kept promoting live batches
into the older generations, whose full passes then walked every object in the process:
30 % of the loop thread's time, measured with ``gc.callbacks`` (0.8 s of 2.7 s per
million passthrough messages; 0.2 s at ``batch_size`` 1,000). Reference counting frees
those objects anyway; the collector is only needed for cycles, which the hot path does
not make. So while a loop runs, the youngest generation's threshold is raised above
what a turn keeps alive; the other thresholds and the collector itself are untouched.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paced_for"]

_OBJECTS_PER_MESSAGE = 5
"""Container objects a turn holds per message at its peak, rounded up."""


@contextmanager
def paced_for(batch_size: int) -> Iterator[None]:
    """Raise (never lower) the youngest generation's threshold for ``batch_size`` while
    the block runs; put back the thresholds found on leaving it."""
    thresholds = gc.get_threshold()
    wanted = _OBJECTS_PER_MESSAGE * batch_size
    if thresholds[0] >= wanted:
        yield
        return
    gc.set_threshold(wanted, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
