"""The tracer provider ``Config.tracing`` asks for, built on the ``otel`` extra's SDK and
OTLP/HTTP exporter (imported only here). ``TopicProcessor`` builds it when it is given no
provider of its own, and shuts it down when it closes, which exports the spans left.

The standard variables are the SDK's: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``..._TRACES_ENDPOINT``) when ``Config.otlp_endpoint`` is unset, ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` over the default service name, ``Config.name``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from kasper_py.exceptions import ConfigError

if TYPE_CHECKING:
    from kasper_py.config import Config

__all__ = ["provider_for"]

_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def provider_for(config: Config) -> TracerProvider:
    """A tracer provider exporting in batches, off the loop's thread, to what
    ``config.tracing`` names (``otlp`` or ``console``), its service named by
    ``service_resource``."""
    provider = TracerProvider(resource=service_resource(config))
    provider.add_span_processor(BatchSpanProcessor(_exporter(config)))
    return provider


def service_resource(config: Config) -> Resource:
    """The SDK's resource (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``), its
    ``service.name`` the processor's ``name`` unless one of those sets it."""
    from_environment = OTELResourceDetector().detect().attributes
    return Resource.create({} if SERVICE_NAME in from_environment
                           else {SERVICE_NAME: config.name})


def _exporter(config: Config) -> SpanExporter:
    if config.tracing == "console":
        return ConsoleSpanExporter(out=sys.stdout)  # the stream now, not at import
    for variable in _PROTOCOL_VARIABLES:
        protocol = os.environ.get(variable, "").strip()
        if protocol and protocol != "http/protobuf":
            raise ConfigError("tracing", f"{variable}={protocol!r}: kasper_py exports over "
                              "OTLP/HTTP (http/protobuf); unset it and point otlp_endpoint "
                              "at the collector's HTTP port (4318 by default)")
    url = config.otlp_endpoint
    return OTLPSpanExporter(endpoint=None if url is None else f"{url.rstrip('/')}/v1/traces")
