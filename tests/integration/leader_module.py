"""An app for the leader-task tests: one processor that ignores its input (from
``$LEADER_INPUT_TOPIC``) and a leader-only task that, every second, sends one record
naming the process that ran it (its pid, the run's time) to ``$LEADER_OUTPUT_TOPIC``;
with ``$LEADER_ONCE`` set, a one-time leader-only task instead (``once=True``).

    kasper run leader_module:app --app-dir tests/integration --processes 3
"""

from __future__ import annotations

import json
import os

from kasper_py import Message, MessageProcessor, Sender
from kasper_py.app import App


class Ignore(MessageProcessor):
    """Reads its input and sends nothing: the app is there for its task."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        pass


def tick(now_ms: int, sender: Sender) -> None:
    """One run of the leader-only task: who ran it, and when."""
    record = {"pid": os.getpid(), "at": now_ms}
    sender.send(os.environ["LEADER_OUTPUT_TOPIC"], json.dumps(record).encode(), b"leader")


app = App(os.environ.get("LEADER_APP", "leader-test"))
app.processor("ignore", Ignore, inputs=[os.environ.get("LEADER_INPUT_TOPIC", "leader-in")])
if os.environ.get("LEADER_ONCE"):  # a one-time task instead: once, where the app leads
    app.task(tick, once=True, on_leader=True, name="tick")
else:
    app.task(tick, every=1.0, on_leader=True, name="tick")
