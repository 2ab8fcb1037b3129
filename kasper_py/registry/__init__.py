"""Schema Registry serdes (Avro, Protobuf, JSON Schema) on confluent-kafka's
serializers: the settings (``config``: ``RegistryConfig``), the client shared per
process and registry (``client``) and the serdes (``serdes``). Importing the package
imports no confluent-kafka registry module: that happens on a serde's first use, and
needs ``pip install 'kasper-py[registry]'``.
"""

from __future__ import annotations

from kasper_py.registry.client import shared_client
from kasper_py.registry.config import RegistryConfig, SubjectStrategy
from kasper_py.registry.serdes import (
    FORMATS,
    AvroSerde,
    JsonSchemaSerde,
    ProtobufSerde,
    RegistrySerde,
    registry_serde,
)

__all__ = ["FORMATS", "AvroSerde", "JsonSchemaSerde", "ProtobufSerde", "RegistryConfig",
           "RegistrySerde", "SubjectStrategy", "registry_serde", "shared_client"]
