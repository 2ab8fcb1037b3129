"""``RegistryConfig``: where the schema registry is and how the registry serdes use it
(``Config.registry``, a ``[registry]`` table in TOML). A frozen value with no client in
it: the shared client lives in ``client``, the serdes in ``serdes``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from kasper_py._support.secrets import MASK, remember_secrets
from kasper_py.exceptions import ConfigError

__all__ = ["RegistryConfig", "SubjectStrategy"]

SubjectStrategy = Literal["topic", "record", "topic_record"]
_STRATEGIES = get_args(SubjectStrategy)
_URL = re.compile(r"^https?://\S+$")
_ATTEMPTS = 2  # per URL: one retry, for a kept-alive connection the registry closed
_RETRY_WAIT_MS = 100


@dataclass(frozen=True, repr=False)
class RegistryConfig:
    """A Confluent-compatible schema registry and how the registry serdes (``avro``,
    ``protobuf``, ``json_schema``) use it. Invalid values raise ``ConfigError`` naming
    ``registry``."""

    url: str
    """The registry's base URL, e.g. ``http://127.0.0.1:18085/apis/ccompat/v7`` (the
    local stack's) or ``https://registry:8081``; several may be given, comma-separated."""
    basic_auth: str | None = None
    """A secret: ``user:password`` for HTTP basic auth (``basic.auth.user.info``); masked
    in ``repr``, logs and errors."""
    subject_strategy: SubjectStrategy = "topic"
    """The subject a schema is registered and looked up under: ``topic`` (``<topic>-key``
    / ``<topic>-value``), ``record`` (the record's full name) or ``topic_record``
    (``<topic>-<record name>``)."""
    auto_register: bool = True
    """Register the writer's schema when it is not yet under its subject; ``False``: an
    unregistered schema is a ``SerdeError`` (production registries are often read-only
    to applications)."""
    use_latest_version: bool = False
    """Write with the subject's latest registered schema instead of looking up the one
    given (needs ``auto_register=False``)."""
    key_schema: str | None = None
    """The key's schema for ``key_serde`` ``avro`` or ``json_schema`` (the schema's text,
    or a path to a file holding it), or ``protobuf`` (the message class,
    ``module:Class``). Avro and JSON Schema read without one (the writer's schema)."""
    value_schema: str | None = None
    """The value's schema, as ``key_schema``. For Avro it is also the reader's schema:
    records written with an older one are resolved to it (a field added with a default
    reads as the default)."""

    timeout: float = 10.0
    """Seconds a registry call (one schema lookup or registration, its one retry and
    every URL included) waits for the registry before it fails with
    ``RegistryUnavailableError``, so a registry that accepts connections but never
    answers fails the turn instead of hanging it."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not all(
                _URL.match(url.strip()) for url in self.url.split(",")):
            raise ConfigError("registry", f"url must be an http(s) URL, got {self.url!r}")
        auth = self.basic_auth
        if auth is not None:
            if not isinstance(auth, str) or ":" not in auth:
                raise ConfigError("registry", "basic_auth must be 'user:password'")
            remember_secrets({"registry.basic_auth": auth})
        if self.subject_strategy not in _STRATEGIES:
            raise ConfigError("registry", f"subject_strategy must be one of "
                              f"{', '.join(_STRATEGIES)}, got {self.subject_strategy!r}")
        for name in ("auto_register", "use_latest_version"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError("registry", f"{name} must be true or false")
        if self.use_latest_version and self.auto_register:
            raise ConfigError("registry", "use_latest_version needs auto_register = false")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError("registry", f"timeout must be a number of seconds above 0, "
                              f"got {timeout!r}")
        for name in ("key_schema", "value_schema"):
            schema = getattr(self, name)
            if schema is not None and not (isinstance(schema, str) and schema.strip()):
                raise ConfigError("registry", f"{name} must be a schema, a file path or "
                                  f"'module:Class', got {schema!r}")

    @classmethod
    def of(cls, value: RegistryConfig | Mapping[str, Any] | str) -> RegistryConfig:
        """``value`` as a ``RegistryConfig``: one already, a mapping of its fields (a
        TOML table), or the registry's URL alone (``KASPER_REGISTRY``)."""
        if isinstance(value, RegistryConfig):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            names = [f.name for f in fields(cls)]
            if set(value) - set(names) or "url" not in value:
                raise ConfigError("registry", f"a table of {', '.join(names)} (url "
                                  f"required), got {dict(value)!r}")
            return cls(**value)
        raise ConfigError("registry", f"must be a table or a URL, got {value!r}")

    def client_conf(self) -> dict[str, Any]:
        """The settings of confluent-kafka's ``SchemaRegistryClient``. Its client waits
        forever by default and retries three times per URL with back-offs of up to 20 s;
        here each URL gets two attempts (one retry, after at most 0.1 s) and each
        attempt an equal share of ``timeout``, so a call fails within about
        ``timeout`` whatever the registry does."""
        attempts = _ATTEMPTS * len(self.url.split(","))
        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout / attempts,
                                "max.retries": _ATTEMPTS - 1,
                                "retries.wait.ms": _RETRY_WAIT_MS,
                                "retries.max.wait.ms": _RETRY_WAIT_MS}
        if self.basic_auth is not None:
            conf["basic.auth.user.info"] = self.basic_auth
        return conf

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.basic_auth is not None:
            shown["basic_auth"] = MASK
        parts = [f"{name}={value!r}" for name, value in shown.items()]
        return f"RegistryConfig({', '.join(parts)})"
