"""The windowed page-view count of examples/pageviews_windowed.py with exactly-once, run
as its own process so tests can kill -9 it; each batch of 100 also pauses 10 ms, so a
kill lands mid-run.

    python windows_worker.py BOOTSTRAP NAME TOPIC OUTPUT STATE_DIR [--until-caught-up]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kasper_py import Config, Message, Sender, TopicProcessor
from kasper_py.stores.rocksdb import RocksDBTable

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
from pageviews_windowed import PageViewsPerMinute  # from the examples folder


class Paced(PageViewsPerMinute):
    """The example's processor, 10 ms slower a batch."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        super().process(messages, sender)
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    for positional in ("bootstrap", "name", "topic", "output", "state_dir"):
        parser.add_argument(positional)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args()
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.topic],
                    batch_size=100, batch_wait=0.2, state_dir=args.state_dir, key_serde="str",
                    value_serde="json", processing_guarantee="exactly_once")
    views = RocksDBTable("views", key_serde="bytes", value_serde="bytes")
    processor = TopicProcessor(config, lambda c: Paced(c, args.output),
                               stores=[views])
    print("started", flush=True)
    with processor:
        processor.run_until_stopped(until_caught_up=args.until_caught_up)


if __name__ == "__main__":
    main()
