"""A 20 ms lookup per message through a backlog: ``AsyncMessageProcessor`` against the
same processor written synchronously, in the same run on the same broker.

The lookup is simulated: ``await asyncio.sleep(latency)`` in the async processor,
``time.sleep(latency)`` in the synchronous one (a service that answers in 20 ms however
many calls wait). Both send each message on to an output topic, at-least-once, through
a ``TopicProcessor`` run until caught up. The async one reads ``--messages`` (100,000)
at ``--concurrency`` calls in flight (keys ``key-0`` .. ``key-9999``, one key's calls in
order); the synchronous one would need 100,000 x 20 ms = 33 minutes, so it reads
``--sync-messages`` (500, 10 s) and the two are compared by rate. The target (async >=
50x the synchronous rate) is printed, never asserted.

    python bench/bench_async.py --messages 100000 --concurrency 256
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import structlog
from benchkit import arguments, create_topics, delete_topics, fill, payloads

from kasper_py import (
    AsyncMessageProcessor,
    Config,
    Message,
    MessageProcessor,
    ProcessorContext,
    Sender,
    TopicProcessor,
)

LATENCY = 0.02
"""Seconds of one lookup."""
TARGET = 50.0


class AsyncLookup(AsyncMessageProcessor):
    """One awaited lookup per message, then the message sent on to ``output``."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        super().__init__(context)
        self.output = output

    async def process_message(self, message: Message, sender: Sender) -> None:
        await asyncio.sleep(LATENCY)
        sender.send(self.output, message.value, key=message.key)


class SyncLookup(MessageProcessor):
    """The same lookup, one message after another."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        super().__init__(context)
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            time.sleep(LATENCY)
            sender.send(self.output, message.value, key=message.key)


def run(bootstrap: str, kind: type[MessageProcessor], messages: int, partitions: int,
        concurrency: int) -> float:
    """Messages per second of ``kind`` through a backlog of ``messages``."""
    run_id = uuid.uuid4().hex[:8]
    source, output = f"bench-async-in-{run_id}", f"bench-async-out-{run_id}"
    create_topics(bootstrap, [source, output], partitions)
    try:
        fill(bootstrap, source, partitions, payloads(messages, 100, keyed=True))
        config = Config(name=f"bench-async-{run_id}", bootstrap_servers=bootstrap,
                        input_topics=[source], async_concurrency=concurrency)
        processor = TopicProcessor(config, lambda context: kind(context, output))
        started = time.perf_counter()
        try:
            processor.run_loop(until_caught_up=True)
        finally:
            processor.close()
        return messages / (time.perf_counter() - started)
    finally:
        delete_topics(bootstrap, [source, output])


def main() -> None:
    parser = arguments(__doc__ or "", messages=100_000, partitions=2, batch_size=None)
    parser.add_argument("--sync-messages", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sync_rate = run(args.bootstrap, SyncLookup, args.sync_messages, args.partitions, 1)
    print(f"sync:  {args.sync_messages} messages, {sync_rate:,.0f} msg/s "
          f"(one {LATENCY * 1000:.0f} ms lookup after another)")
    async_rate = run(args.bootstrap, AsyncLookup, args.messages, args.partitions,
                     args.concurrency)
    print(f"async: {args.messages} messages, {async_rate:,.0f} msg/s "
          f"({args.concurrency} lookups in flight at most)")
    ratio = async_rate / sync_rate
    print(f"async / sync: {ratio:.1f}x (target >= {TARGET:.0f}x: "
          f"{'met' if ratio >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
