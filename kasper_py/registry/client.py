"""The schema registry client, one per process and registry (URL, credentials and timeout):
every serde of that registry shares it, and with it confluent-kafka's caches of schemas
by id and of ids by subject and schema. Nothing here talks to the registry by itself.
"""

from __future__ import annotations

import threading
from typing import Any

from kasper_py.registry.config import RegistryConfig

__all__ = ["shared_client"]

_clients: dict[tuple[str, str | None, float], Any] = {}
_lock = threading.Lock()


def shared_client(registry: RegistryConfig) -> Any:
    """The process's ``confluent_kafka.schema_registry.SchemaRegistryClient`` for
    ``registry``'s URL, credentials and timeout, built on first use."""
    key = (registry.url, registry.basic_auth, registry.timeout)
    with _lock:
        client = _clients.get(key)
        if client is None:
            from confluent_kafka.schema_registry import (  # noqa: PLC0415 - the extra
                SchemaRegistryClient,
            )
            client = _clients[key] = SchemaRegistryClient(registry.client_conf())
        return client
