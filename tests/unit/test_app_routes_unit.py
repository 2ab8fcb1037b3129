"""An app's processors inside one partition's turn (``AppProcessor``): which messages
each gets, in which order, and where their repartition and channel sends go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.app import App, AppProcessor, plan_for
from kasper_py.testing import make_message


class Recorder(MessageProcessor):
    """Keeps what it was handed; runs ``act`` on each message."""

    def __init__(self, context: ProcessorContext, act: Callable[[Message, Sender], None]
                 ) -> None:
        self.context, self.act = context, act
        self.got: list[tuple[str, Any]] = []

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            self.got.append((m.topic, m.value))
            self.act(m, sender)


def recorder(act: Callable[[Message, Sender], None] = lambda m, s: None
             ) -> Callable[[ProcessorContext], Recorder]:
    return lambda context: Recorder(context, act)


def partition_of(app: App) -> tuple[AppProcessor, Sender]:
    """Partition 0's processor of ``app`` (named "clicks") and a sender on its routes."""
    config = Config(name="clicks", bootstrap_servers="mem:0", input_topics=list(app.sources))
    plan = plan_for(app, config)
    processor = plan.factory(ProcessorContext(0, plan.config, {}))
    assert isinstance(processor, AppProcessor)
    return processor, Sender(routes=plan.routes)


def test_each_processor_gets_its_topics_grouped_in_the_order_they_first_came() -> None:
    """Interleaved topics of one partition's batch: a processor reading two of them gets
    each topic's messages together, the topic that came first first, offsets in order;
    the other processor gets only its own topic; channel messages come last."""
    app = App("clicks")
    seen = app.channel("seen")
    app.processor("join", recorder(lambda m, s: s.channel("seen", m.value)),
                  inputs=["b", "a"], outputs=[seen])
    app.processor("tail", recorder(), inputs=["c", seen])
    processor, sender = partition_of(app)
    batch = [make_message(t, f"{t}{n}", offset=n)
             for n, t in enumerate(["a", "b", "a", "c", "b", "a"])]

    processor.process(batch, sender)

    join, tail = processor.processors["join"], processor.processors["tail"]
    assert isinstance(join, Recorder) and isinstance(tail, Recorder)
    assert join.got == [("a", "a0"), ("a", "a2"), ("a", "a5"), ("b", "b1"), ("b", "b4")]
    assert tail.got == [("c", "c3"), *(("seen", v) for _, v in join.got)]


def test_repartition_sends_go_to_the_apps_own_topic_by_key() -> None:
    """What a processor sends to its declared repartition is buffered for
    ``<Config.name>-<repartition>-repartition`` with the new key, no partition chosen
    (the producer's murmur2 chooses it)."""
    app = App("clicks")
    by_user = app.repartition("by-user")
    app.processor("parse", recorder(lambda m, s: s.repartition("by-user", m.value, key=b"u")),
                  inputs=["views"], outputs=[by_user])
    app.processor("count", recorder(), inputs=[by_user])
    processor, sender = partition_of(app)

    processor.process([make_message("views", b"v0"), make_message("views", b"v1")], sender)

    assert [(m.topic, m.key, m.value, m.partition) for m in sender.messages] == [
        ("clicks-by-user-repartition", b"u", b"v0", None),
        ("clicks-by-user-repartition", b"u", b"v1", None)]


@pytest.mark.parametrize(("send", "error"), [
    (lambda s: s.repartition("by-page", b"v", key=b"k"),
     "processor 'parse' sends to repartition 'by-page', which it does not declare: add "
     "it to its outputs"),
    (lambda s: s.repartition("by-nothing", b"v", key=b"k"),
     "no repartition 'by-nothing' in app 'clicks'; declared: ['by-page', 'by-user']"),
    (lambda s: s.channel("counted", b"v"),
     "processor 'parse' sends to channel 'counted', which it does not declare: add it to "
     "its outputs"),
])
def test_a_send_the_processor_does_not_declare_is_refused(
        send: Callable[[Sender], None], error: str) -> None:
    """A processor sends only to the repartitions and channels it declares; an unknown
    repartition names the declared ones."""
    app = App("clicks")
    by_user, by_page, counted = (app.repartition("by-user"), app.repartition("by-page"),
                                 app.channel("counted"))
    app.processor("parse", recorder(lambda m, s: send(s)), inputs=["views"],
                  outputs=[by_user])
    app.processor("pages", recorder(), inputs=["pages"], outputs=[by_page, counted])
    app.processor("count", recorder(), inputs=[by_user, by_page, counted])
    processor, sender = partition_of(app)

    with pytest.raises(ValueError) as raised:
        processor.process([make_message("views", b"v")], sender)

    assert str(raised.value) == error
    assert "in processor 'parse' of app 'clicks'" in raised.value.__notes__
