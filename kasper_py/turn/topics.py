"""The turn's check that the topics it sends to exist, before anything of it is
produced: asked of the output port once per topic, for the new ones only.
"""

from __future__ import annotations

from kasper_py.config import Config
from kasper_py.exceptions import TopicError
from kasper_py.kafka.ports import OutputPort

__all__ = ["TopicCheck"]


class TopicCheck:
    """The topics one engine's turns sent to and found to exist: each is asked once."""

    def __init__(self, config: Config, port: OutputPort) -> None:
        self.config = config
        self._port = port
        self._found: set[str] = set()

    def check(self, topics: set[str]) -> None:
        """Raise ``TopicError`` when some of ``topics`` no turn of this engine sent to
        yet does not exist. A send never creates a topic, so a typo fails the turn here,
        uncommitted, rather than after ``delivery_timeout`` (or by creating it)."""
        new = topics - self._found
        if not new:
            return
        missing = self._port.missing_topics(new)
        if missing:
            listed = ", ".join(f"{topic!r} ({why})" for topic, why in sorted(missing.items()))
            raise TopicError(
                f"processor {self.config.name!r} sent messages to {listed} on "
                f"{self.config.bootstrap_servers}; nothing of the turn was produced. A send "
                "never creates a topic: create it (a typo?), or declare it in "
                "Config.output_topics and start with `kasper run --create-topics`")
        self._found |= new
