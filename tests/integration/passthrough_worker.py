"""A passthrough processor run as its own process, so tests can kill -9 it.

    python passthrough_worker.py BOOTSTRAP NAME INPUT OUTPUT BATCH_SIZE [--until-caught-up]
                                 [--pause SECONDS]

``--pause`` sleeps in every process() call, so a run lasts long enough for a test to
kill it mid-run however fast the machine is.
"""

from __future__ import annotations

import sys
import time

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor


class Passthrough(MessageProcessor):
    def __init__(self, context: ProcessorContext, output: str, pause: float) -> None:
        self.output = output
        self.pause = pause

    def process(self, messages: list[Message], sender: Sender) -> None:
        time.sleep(self.pause)
        for message in messages:
            sender.send(self.output, message.value, key=message.key, partition=message.partition)


def main() -> None:
    bootstrap, name, source, output, batch_size = sys.argv[1:6]
    config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                    batch_size=int(batch_size), batch_wait=0.2)
    pause = float(sys.argv[sys.argv.index("--pause") + 1]) if "--pause" in sys.argv else 0.0
    processor = TopicProcessor(config, lambda c: Passthrough(c, output, pause))
    print("started", flush=True)
    processor.run_loop(until_caught_up="--until-caught-up" in sys.argv)
    processor.close()


if __name__ == "__main__":
    main()
