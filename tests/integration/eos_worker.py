"""The command line and loop the kill -9 workers share (dedup_worker.py,
windows_worker.py): ``BOOTSTRAP NAME TOPIC OUTPUT STATE_DIR [--until-caught-up]``, an
exactly-once loop with str keys and local tables, "started" printed once it is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from kasper_py import Config, MessageProcessor, ProcessorContext, TopicProcessor
from kasper_py.stores.base import StoreSpec


def run_worker(processor: Callable[[ProcessorContext, str], MessageProcessor],
               stores: Sequence[StoreSpec], *, batch_size: int, value_serde: str) -> None:
    """Run ``processor`` (given its context and the output topic) over the command
    line's topic until stopped (or caught up, with ``--until-caught-up``)."""
    parser = argparse.ArgumentParser()
    for positional in ("bootstrap", "name", "topic", "output", "state_dir"):
        parser.add_argument(positional)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args()
    config = Config(name=args.name, bootstrap_servers=args.bootstrap, input_topics=[args.topic],
                    batch_size=batch_size, batch_wait=0.2, state_dir=args.state_dir,
                    key_serde="str", value_serde=value_serde,
                    processing_guarantee="exactly_once")
    loop = TopicProcessor(config, lambda c: processor(c, args.output), stores=stores)
    print("started", flush=True)
    with loop:
        loop.run_until_stopped(until_caught_up=args.until_caught_up)
