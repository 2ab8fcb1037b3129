"""A passthrough processor run as its own process, so tests can kill -9 it.

    python passthrough_worker.py BOOTSTRAP NAME INPUT OUTPUT BATCH_SIZE [--until-caught-up]
"""

from __future__ import annotations

import sys

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor


class Passthrough(MessageProcessor):
    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send(self.output, message.value, key=message.key, partition=message.partition)


def main() -> None:
    bootstrap, name, source, output, batch_size = sys.argv[1:6]
    config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                    batch_size=int(batch_size), batch_wait=0.2)
    processor = TopicProcessor(config, lambda c: Passthrough(c, output))
    print("started", flush=True)
    processor.run_loop(until_caught_up="--until-caught-up" in sys.argv)
    processor.close()


if __name__ == "__main__":
    main()
