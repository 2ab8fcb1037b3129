"""Which client settings may be shown, and the masking of all the others.

The rule is an allow-list: a client override's value is shown only when its key is a
known-harmless librdkafka setting (a timeout, a size, the security protocol, ...);
every other value is masked in ``repr(Config)``, logs, errors and CLI output. A
list of secret *names* always misses one (``sasl.oauthbearer.config``,
``sasl.kerberos.kinit.cmd``), so the masked values themselves are also remembered
and scrubbed from any text the library writes out (librdkafka's own log lines and
error strings included).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["HARMLESS_PROPERTIES", "MASK", "SENSITIVE_PROPERTIES", "is_harmless",
           "is_secret_field", "masked_fields", "masked_settings", "remember_secrets", "scrub"]

MASK = "***"

SENSITIVE_PROPERTIES: tuple[str, ...] = (
    # flagged _RK_SENSITIVE in librdkafka's property table (src/rdkafka_conf.c), which
    # its own configuration dump redacts
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    # not flagged by librdkafka, but they carry credentials or run a command with them
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.keytab",
    "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.token.endpoint.url",
)
"""Properties whose values are secrets; masked whatever the allow-list says."""

HARMLESS_PROPERTIES: frozenset[str] = frozenset({
    # connection and security choices (no credentials in them)
    "bootstrap.servers", "client.id", "client.rack", "security.protocol",
    "sasl.mechanism", "sasl.mechanisms", "sasl.kerberos.service.name",
    "sasl.oauthbearer.method", "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm", "ssl.ca.location",
    "broker.address.family", "api.version.request",
    # timeouts, intervals and back-offs
    "socket.timeout.ms", "socket.connection.setup.timeout.ms", "socket.keepalive.enable",
    "reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.ms",
    "retry.backoff.max.ms", "request.timeout.ms", "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms", "session.timeout.ms", "heartbeat.interval.ms",
    "max.poll.interval.ms", "fetch.wait.max.ms", "fetch.error.backoff.ms",
    "fetch.queue.backoff.ms", "linger.ms", "queue.buffering.max.ms", "message.timeout.ms",
    "delivery.timeout.ms", "transaction.timeout.ms", "statistics.interval.ms",
    # sizes and counts
    "fetch.min.bytes", "fetch.max.bytes", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "queued.min.messages", "queued.max.messages.kbytes",
    "message.max.bytes", "receive.message.max.bytes", "batch.size", "batch.num.messages",
    "queue.buffering.max.messages", "queue.buffering.max.kbytes", "retries",
    "message.send.max.retries", "max.in.flight.requests.per.connection", "max.in.flight",
    "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
    # behaviour switches the library itself sets or checks
    "acks", "enable.idempotence", "enable.auto.commit", "enable.auto.offset.store",
    "auto.offset.reset", "isolation.level", "enable.partition.eof", "partitioner",
    "compression.type", "compression.codec", "check.crcs", "allow.auto.create.topics",
    "group.protocol", "partition.assignment.strategy", "log_level", "debug",
})
"""librdkafka settings whose values are shown; everything else is masked."""

_SECRET_MARKERS = ("password", "secret", "jaas", ".pem", "token", "credentials", "apikey",
                   "api_key", "private_key")
_MIN_SCRUBBED = 6  # shorter values ("true", "1") would blank out ordinary log text
_remembered: tuple[str, ...] = ()  # longest first, so a secret holding another goes whole
_lock = threading.Lock()
_ASSIGNMENT_WORDS = ("password", "secret", "token", "jaas")
"""The words one of which the key of a ``key=value`` secret holds."""
# a secret written as `key=value` inside text (an error string, a client's log line)
_SECRET_ASSIGNMENT = re.compile(
    rf"""(?P<key>[\w.\-]*(?:{"|".join(_ASSIGNMENT_WORDS)})[\w.\-]*)(?P<sep>["']?\s*[=:]\s*)"""
    r"""(?P<value>"[^"]*"|'[^']*'|[^\s,;}\]]+)""",
    re.IGNORECASE,
)


def is_harmless(key: str) -> bool:
    """True when the value of client setting ``key`` may be printed."""
    return key in HARMLESS_PROPERTIES and key not in SENSITIVE_PROPERTIES


@functools.lru_cache(maxsize=4096)
def is_secret_field(name: str) -> bool:
    """True for a log field or mapping key whose value must not be printed: a sensitive
    or unlisted SSL/SASL client setting, or a name that suggests a credential. (Values
    of every masked client setting are also scrubbed from text; see ``scrub``.)"""
    lowered = name.lower()
    if lowered in SENSITIVE_PROPERTIES or (
            lowered.startswith(("ssl.", "sasl.")) and not is_harmless(lowered)):
        return True
    return any(marker in lowered for marker in _SECRET_MARKERS)


def masked_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every value that is not known to be harmless replaced by MASK."""
    return {key: value if is_harmless(key) else MASK for key, value in settings.items()}


def remember_secrets(settings: Mapping[str, Any]) -> None:
    """Remember the masked values of ``settings``, so ``scrub`` hides them in any text."""
    global _remembered  # noqa: PLW0603 - one process-wide set: any output may carry them
    values = {str(value) for key, value in settings.items()
              if not is_harmless(key) and len(str(value)) >= _MIN_SCRUBBED}
    with _lock:
        if values - set(_remembered):
            _remembered = tuple(sorted(values | set(_remembered), key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` with every remembered secret value replaced by MASK."""
    for secret in _remembered:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def masked_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A log event's ``fields`` with the values whose key names a secret masked, in
    nested mappings too, ``key=value`` secrets inside text, and every remembered secret
    scrubbed; ``exc_info`` is left for the renderer (which scrubs what it renders)."""
    return {key: value if key == "exc_info" else _masked(key, value)
            for key, value in fields.items()}


def _names_secret(text: str) -> bool:
    """True when ``text`` holds a word ``_SECRET_ASSIGNMENT``'s key needs (a cheap test
    before the pattern, which is slow to fail on text without one)."""
    folded = text.casefold()  # as the pattern's IGNORECASE matches
    return any(word in folded for word in _ASSIGNMENT_WORDS)


_PLAIN = frozenset({int, float, bool, type(None)})
"""Types of a log field's value that hold no text, so nothing in them to mask."""


def _masked(key: str, value: Any) -> Any:
    if is_secret_field(key):
        return MASK
    if type(value) in _PLAIN:  # a turn's counts and timings: most fields of a busy log
        return value
    if isinstance(value, Mapping):
        return {k: _masked(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        masked = [_masked("", item) for item in value]
        return masked if isinstance(value, list) else tuple(masked)
    if isinstance(value, str) and value:
        if ("=" in value or ":" in value) and _names_secret(value):  # as the pattern needs
            value = _SECRET_ASSIGNMENT.sub(lambda m: f"{m['key']}{m['sep']}{MASK}", value)
        return scrub(value)
    return value
