"""OpenTelemetry tracing (``TopicProcessor(tracer_provider=)``, the ``otel`` extra) of the
real ``TopicProcessor`` on the in-memory broker, spans caught by the SDK's
``InMemorySpanExporter``: a span per turn with a child per step, links to the inputs'
``traceparent``, the turn's ``traceparent`` on every output, a failed turn marked as an
error, and nothing traced (nor any header added) when tracing is off."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.exceptions import ProcessingError
from kasper_py.observability.tracing import NOOP_TRACING, tracing_for
from kasper_py.testing import InMemoryBroker

CONFIG = Config(name="traced", bootstrap_servers="in-memory", input_topics=["in"],
                batch_size=3)
PRODUCER_TRACE = "0af7651916cd43dd8448eb211c80319c"
STEPS = ["kasper.process", "kasper.flush", "kasper.produce", "kasper.commit"]


def traceparent(span_id: int) -> bytes:
    return f"00-{PRODUCER_TRACE}-{span_id:016x}-01".encode()


class Forward(MessageProcessor):
    """Sends each input's value to "out"; raises on the value ``boom``."""

    def __init__(self, context: ProcessorContext) -> None:
        pass

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            if m.value == b"boom":
                raise ValueError("boom")
            headers = [("traceparent", b"mine")] if m.value == b"own" else None
            sender.send("out", m.value, headers=headers)


def traced_run(broker: InMemoryBroker, provider: Any = None, *,
               fails: bool = False) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    if provider is None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    processor = TopicProcessor(CONFIG, Forward, clients=broker.clients(CONFIG),
                               tracer_provider=provider)
    if fails:
        with pytest.raises(ProcessingError):
            processor.run_loop(until_caught_up=True)
    else:
        processor.run_loop(until_caught_up=True)
        processor.close()
    return list(exporter.get_finished_spans())


def broker_with(*values: str, headers: list[tuple[str, bytes]] | None = None) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.create_topic("out")
    for n, value in enumerate(values):
        broker.produce("in", value, headers=headers or [("traceparent", traceparent(n + 1))])
    return broker


def turns(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.name == "kasper.turn"]


def test_a_span_per_turn_with_a_child_per_step() -> None:
    """Six inputs in batches of three: two turn spans, each a root with the four step
    spans as children, in order, and the batch's size and the topic as attributes."""
    spans = traced_run(broker_with(*"abcdef"))
    assert len(turns(spans)) == 2
    for turn in turns(spans):
        assert turn.parent is None
        children = sorted((s for s in spans if s.parent is not None
                           and s.parent.span_id == turn.context.span_id),
                          key=lambda s: s.start_time or 0)
        assert [s.name for s in children] == STEPS
        assert all(s.context.trace_id == turn.context.trace_id for s in children)
        assert turn.attributes is not None
        assert turn.attributes["messaging.batch.message_count"] == 3
        assert turn.attributes["messaging.destination.name"] == "in"
        assert turn.status.status_code is StatusCode.UNSET


def test_turn_links_to_each_inputs_traceparent() -> None:
    """A turn's span links to the producing span of each input carrying a valid
    ``traceparent``, once per distinct span; invalid ones are ignored."""
    broker = broker_with("a", "b")
    broker.produce("in", "c", headers=[("traceparent", b"not-a-traceparent")])
    broker.produce("in", "d", headers=[("traceparent", traceparent(2))])  # a duplicate
    broker.produce("in", "e")
    broker.produce("in", "f", headers=[("traceparent", traceparent(3))])
    first, second = sorted(turns(traced_run(broker)), key=lambda s: s.start_time or 0)
    assert [(format(link.context.trace_id, "032x"), link.context.span_id)
            for link in first.links] == [(PRODUCER_TRACE, 1), (PRODUCER_TRACE, 2)]
    assert [link.context.span_id for link in second.links] == [2, 3]
    assert all(link.context.is_remote for link in first.links)


def test_outputs_carry_the_turns_traceparent() -> None:
    """Every output carries the ``traceparent`` of the turn that produced it; one the
    processor set itself is kept as it is."""
    broker = broker_with("a", "b", "own", "d")
    spans = traced_run(broker)
    by_turn = {f"00-{t.context.trace_id:032x}-{t.context.span_id:016x}".encode()
               for t in turns(spans)}
    out = broker.read("out")
    headers = {m.value: dict(m.headers)["traceparent"] for m in out}
    assert headers.pop(b"own") == b"mine"
    assert {value[:-3] for value in headers.values()} == by_turn  # less "-<flags>"
    assert [len(m.headers) for m in out] == [1, 1, 1, 1]


def test_failed_turn_is_marked_as_error() -> None:
    """A turn whose ``process()`` raises: its span and its process step's span end with
    status ERROR and the exception recorded; nothing of it is produced."""
    spans = traced_run(broker_with("a", "boom"), fails=True)
    (turn,) = turns(spans)
    assert turn.status.status_code is StatusCode.ERROR
    assert "ProcessingError" in (turn.status.description or "")
    (process,) = [s for s in spans if s.name != "kasper.turn"]
    assert process.name == "kasper.process"
    assert process.status.status_code is StatusCode.ERROR
    assert [e.name for e in turn.events] == ["exception"]


def test_nothing_traced_when_off() -> None:
    """With no tracer provider, no span is made (the provider built beside it sees none)
    and outputs get no header: the tracing port is the no-op one."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    broker = broker_with("a", "b", headers=[("other", b"x")])
    processor = TopicProcessor(CONFIG, Forward, clients=broker.clients(CONFIG))
    processor.run_loop(until_caught_up=True)
    processor.close()
    assert exporter.get_finished_spans() == ()
    assert [m.headers for m in broker.read("out")] == [(), ()]
    assert tracing_for(CONFIG, None) is NOOP_TRACING


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without opentelemetry installed, asking for tracing names the extra to install."""
    monkeypatch.setitem(sys.modules, "kasper_py.observability.otel", None)
    with pytest.raises(ImportError, match=r"pip install 'kasper-py\[otel\]'"):
        tracing_for(CONFIG, object())
