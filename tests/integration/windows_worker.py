"""The windowed page-view count of examples/pageviews_windowed.py with exactly-once, run
as its own process so tests can kill -9 it; each batch of 100 also pauses 10 ms, so a
kill lands mid-run.

    python windows_worker.py BOOTSTRAP NAME TOPIC OUTPUT STATE_DIR [--until-caught-up]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kasper_py import Message, Sender
from kasper_py.stores.rocksdb import RocksDBTable

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
from pageviews_windowed import PageViewsPerMinute  # from the examples folder

from eos_worker import run_worker  # isort: skip - a sibling script


class Paced(PageViewsPerMinute):
    """The example's processor, 10 ms slower a batch."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        super().process(messages, sender)
        time.sleep(0.01)


def main() -> None:
    run_worker(Paced, [RocksDBTable("views", key_serde="bytes", value_serde="bytes")],
               batch_size=100, value_serde="json")


if __name__ == "__main__":
    main()
