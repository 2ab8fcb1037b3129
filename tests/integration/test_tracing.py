"""OpenTelemetry tracing of the live loop on a real broker (``tracer_provider=``), spans
caught by the SDK's in-memory exporter: the input's ``traceparent`` becomes a link of the
turn's span, the outputs carry the turn's own, in both processing guarantees."""

from __future__ import annotations

import pytest

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from tests.kafka_clients import Producer

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.integration
PRODUCER_TRACE, PRODUCER_SPAN_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
PRODUCER_SPAN = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN_ID}-01"


class Forward(MessageProcessor):
    """Sends each value to ``output``."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.send(self.output, message.value)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_live_loop_links_inputs_and_propagates_onto_outputs(
        bootstrap, new_topic, kafka, unique_name, guarantee) -> None:
    """Ten inputs carrying a producer's ``traceparent``: one turn span (a new trace,
    linked to the producer's span) with its four step spans, and every output carrying
    the turn's ``traceparent``; the offsets are committed."""
    source, output = new_topic("in"), new_topic("out")
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(10):
        producer.produce(source, b"v%d" % n, headers=[("traceparent", PRODUCER_SPAN.encode())])
    assert producer.flush(30) == 0
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    name = unique_name("traced")
    cfg = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                 batch_size=100, batch_wait=0.2, processing_guarantee=guarantee)
    with TopicProcessor(cfg, lambda c: Forward(c, output), tracer_provider=provider) as loop:
        loop.run_loop(until_caught_up=True)
    spans = exporter.get_finished_spans()
    turns = [s for s in spans if s.name == "kasper.turn"]  # one, unless a fetch split it
    for turn in turns:
        assert sorted(s.name for s in spans if s.parent is not None
                      and s.parent.span_id == turn.context.span_id) == sorted(
            ["kasper.process", "kasper.flush", "kasper.produce", "kasper.commit"])
        assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}")
                for link in turn.links] == [(PRODUCER_TRACE, PRODUCER_SPAN_ID)]
    ours = {f"00-{t.context.trace_id:032x}-{t.context.span_id:016x}" for t in turns}
    received = kafka.read_all(output)
    assert [m.value() for m in received] == [b"v%d" % n for n in range(10)]
    assert {dict(m.headers())["traceparent"].decode()[:-3] for m in received} == ours
    assert kafka.committed(name, source, 1) == {0: 10}
