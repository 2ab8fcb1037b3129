"""The library's consumer and producer against a broker that is down, run as its own
process so a test can read everything it writes to stderr.

    python outage_worker.py BOOTSTRAP SECONDS

Consumes for SECONDS, then produces one message and waits for its ack (which fails
after a 2 s delivery timeout), with the library's JSON logging on stderr.
"""

from __future__ import annotations

import contextlib
import sys
import time

from kasper_py import Config
from kasper_py.exceptions import ProduceError
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.producer import OutputProducer
from kasper_py.message import OutgoingMessage
from kasper_py.observability.logging import configure_logging


def main() -> None:
    bootstrap, seconds = sys.argv[1], float(sys.argv[2])
    configure_logging(json=True)
    config = Config(name="outage", bootstrap_servers=bootstrap, input_topics=["in"],
                    delivery_timeout=2.0)
    consumer = InputConsumer(config)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer.consume(100, 0.5)
    producer = OutputProducer(config)
    producer.produce([OutgoingMessage("out", b"value", None, None, None).record()])
    with contextlib.suppress(ProduceError):  # expected: nothing can be delivered
        producer.wait_for_acks()
    producer.close(discard=True)
    consumer.close()


if __name__ == "__main__":
    main()
