"""OpenTelemetry tracing of the loop's turns (the ``otel`` extra; opentelemetry is
imported only here). Spans, following the OpenTelemetry messaging conventions for a
batch receive:

- ``kasper.turn`` (kind ``CONSUMER``), one per turn, a new trace: one span link per
  distinct W3C ``traceparent`` among the batch's input headers (a batch has many
  producers, so they are links, not parents), at most ``MAX_LINKS``;
- ``kasper.process``, ``kasper.flush``, ``kasper.produce`` (handing over and waiting
  for every ack, the read-ahead included) and ``kasper.commit``: its children, from the
  engine's step boundaries. With effectively-once stores the flush step comes after
  the outputs, and ``kasper.flush`` holds their produce (and commit) too.

Every record the turn produces (dead letters included) carries the ``traceparent`` of
the turn's span, unless the processor set one itself: the turn is the unit that
produced it, and its links lead back to the inputs. A failed turn's span, and the
step span it failed in, end with status ``ERROR`` and the exception recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kasper_py.message import OutgoingRecord
from kasper_py.steps import STEPS

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.kafka.batching import Batch
    from kasper_py.kafka.ports import OutputPort

__all__ = ["MAX_LINKS", "TRACEPARENT", "TurnTracer"]

TRACEPARENT = "traceparent"
MAX_LINKS = 128
"""Links per turn span at most (the SDK's default limit): the first distinct ones."""
_PROPAGATOR = TraceContextTextMapPropagator()
_OPENS = {"before_process": f"kasper.{STEPS[0].name}",
          **{step.after: f"kasper.{following.name}"
             for step, following in pairwise(STEPS)
             if step.after is not None and following.timed}}
"""The step span each step boundary opens (after closing the one open): the next timed
step's (``kasper_py.steps.STEPS``), so ``kasper.produce`` holds the ack wait (step 4);
none for the runner's report."""


class TurnTracer:
    """``Tracing`` on an OpenTelemetry tracer provider, for one processor's loop thread."""

    def __init__(self, config: Config, tracer_provider: Any, *, owned: bool = False) -> None:
        """``owned``: this built ``tracer_provider`` and shuts it down at ``close()``."""
        self._tracer = trace.get_tracer("kasper_py", tracer_provider=tracer_provider)
        self._provider = tracer_provider if owned else None
        self._attributes: dict[str, Any] = {
            "messaging.system": "kafka", "messaging.operation.type": "process",
            "messaging.consumer.group.name": config.group,
            "messaging.destination.name": ",".join(config.input_topics)}
        self._turn: Span | None = None
        self._step: Span | None = None
        self._header: bytes = b""

    @contextmanager
    def turn(self, batch: Batch) -> Iterator[None]:
        attributes = {**self._attributes, "messaging.batch.message_count": len(batch)}
        span = self._tracer.start_span("kasper.turn", kind=SpanKind.CONSUMER,
                                       attributes=attributes, links=input_links(batch))
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        self._turn, self._header = span, carrier[TRACEPARENT].encode()
        try:
            yield
        except BaseException as exc:
            for failed in (self._step, span):
                if failed is not None:
                    failed.record_exception(exc)
                    failed.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self._end_step()
            span.end()
            self._turn = None

    def on_step(self, inner: Callable[[str], None]) -> Callable[[str], None]:
        def step(boundary: str) -> None:
            self._end_step()
            name = _OPENS.get(boundary)
            if name is not None and self._turn is not None:
                self._step = self._tracer.start_span(
                    name, context=trace.set_span_in_context(self._turn))
            inner(boundary)
        return step

    def port(self, port: OutputPort) -> OutputPort:
        return _TracedPort(port, self)

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None

    def header(self) -> bytes:
        """The running turn's ``traceparent``."""
        return self._header

    def _end_step(self) -> None:
        if self._step is not None:
            self._step.end()
            self._step = None


class _TracedPort:
    """An output port whose records carry the running turn's ``traceparent``."""

    def __init__(self, port: OutputPort, tracer: TurnTracer) -> None:
        self._port, self._tracer = port, tracer

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        header = (TRACEPARENT, self._tracer.header())
        self._port.produce([_with_header(record, header) for record in messages])

    def wait_for_acks(self, waiting: Callable[[], None] | None = None) -> None:
        self._port.wait_for_acks(waiting)

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        return self._port.missing_topics(topics)


def _with_header(record: OutgoingRecord, header: tuple[str, bytes]) -> OutgoingRecord:
    """``record`` with ``header`` added to its headers, unless it has a ``traceparent``."""
    if len(record) < 8:
        return (*record, [header])
    headers = record[7]
    if any(name == TRACEPARENT for name, _ in headers):
        return record
    return (*record[:7], [*headers, header])


def input_links(batch: Batch) -> list[Link]:
    """A link to each distinct valid ``traceparent`` of ``batch``'s input, in order, at
    most ``MAX_LINKS``."""
    seen: dict[tuple[int, int], Link] = {}
    for messages in batch.by_partition.values():
        for message in messages:
            for name, value in message.headers:
                if name == TRACEPARENT and value and len(seen) < MAX_LINKS:
                    context = _span_context(value)
                    if context is not None:
                        seen.setdefault((context.trace_id, context.span_id), Link(context))
    return list(seen.values())


def _span_context(value: bytes) -> SpanContext | None:
    """The remote span context ``value`` (a W3C ``traceparent``) names, if valid."""
    try:
        carrier = {TRACEPARENT: value.decode("ascii")}
    except UnicodeDecodeError:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return context if context.is_valid else None
