"""The tracing port of the loop and its no-op default. ``TopicProcessor(tracer_provider=)``
or ``Config.tracing`` turns tracing on: ``tracing_for`` then builds ``otel.TurnTracer``
(the ``otel`` extra, imported only there and in ``otel_export``), on the given provider or
on one of its own that it shuts down at ``close()``. Off, nothing is wrapped: no
per-record or per-step work, one shared no-op context manager per turn.

What a tracer does, once per turn of the live loop:

- ``turn(batch)``: a span around the turn (its retries with exactly-once included);
- ``on_step(inner)``: the engine's step hook (``kasper_py.steps.BOUNDARIES``) opening and
  closing a child span per step, then calling ``inner`` (fault injection);
- ``port(port)``: the engine's output port, adding the turn's ``traceparent`` header to
  every record it produces;
- ``close()``, once, when the processor closes: a provider it built exports what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.kafka.batching import Batch
    from kasper_py.kafka.ports import OutputPort

__all__ = ["INSTALL_HINT", "NOOP_TRACING", "NoTracing", "Tracing", "tracing_for"]

INSTALL_HINT = "pip install 'kasper-py[otel]'"

_NOTHING: AbstractContextManager[None] = nullcontext()


class Tracing(Protocol):
    """Traces the turns of one ``TopicProcessor``."""

    def turn(self, batch: Batch) -> AbstractContextManager[None]:
        """A context around one turn over ``batch``; an exception leaving it failed the
        turn."""

    def on_step(self, inner: Callable[[str], None]) -> Callable[[str], None]:
        """The engine's ``on_step``: traces the step boundaries, then calls ``inner``."""

    def port(self, port: OutputPort) -> OutputPort:
        """The engine's output port: ``port``, its records carrying the trace."""

    def close(self) -> None:
        """Shut down the tracer provider if this built it (exporting the spans left)."""


class NoTracing:
    """Traces nothing, and adds nothing to a turn but an empty ``with``."""

    def turn(self, batch: Batch) -> AbstractContextManager[None]:
        return _NOTHING

    def on_step(self, inner: Callable[[str], None]) -> Callable[[str], None]:
        return inner

    def port(self, port: OutputPort) -> OutputPort:
        return port

    def close(self) -> None:
        pass


NOOP_TRACING = NoTracing()


def tracing_for(config: Config, tracer_provider: object | None) -> Tracing:
    """An OpenTelemetry ``TurnTracer`` on ``tracer_provider`` (an
    ``opentelemetry.trace.TracerProvider``), else on a provider of its own when
    ``config.tracing`` asks for one, else ``NOOP_TRACING``. Raises ``ImportError`` naming
    the extra when opentelemetry is not installed."""
    if tracer_provider is None and config.tracing == "none":
        return NOOP_TRACING
    try:
        from kasper_py.observability.otel import TurnTracer  # noqa: PLC0415 - optional extra

        if tracer_provider is not None:
            return TurnTracer(config, tracer_provider)
        from kasper_py.observability.otel_export import provider_for  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("kasper_py tracing needs the OpenTelemetry SDK and OTLP exporter, "
                          f"which are not installed: {INSTALL_HINT}") from exc
    return TurnTracer(config, provider_for(config), owned=True)
