"""librdkafka's dotted keys for a ``Config``: the one converter (consumer, producer and
admin client alike), with the one precedence rule, and the checks that keep overrides
from replacing a field or weakening the commit contract. ``Config``'s own
``to_*_conf()`` methods are the public face; validation of the fields stays there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from kasper_py._support.query_settings import announced_endpoint
from kasper_py._support.secrets import remember_secrets
from kasper_py.exceptions import ConfigError

__all__ = ["ClientSettings", "ClientValue", "admin_conf", "checked_overrides",
           "consumer_conf", "endpoint_of_member", "member_client_id", "producer_conf",
           "refuse_unsafe_overrides"]

ClientValue = str | int | float | bool

_GROUP_TRANSACTION_TIMEOUT_MS = 10_000
_ENDPOINT_MARK = ";query="
_MAX_QUEUE_KBYTES = 2_097_151  # librdkafka's largest queued.max.messages.kbytes
_TAKEOVER_FETCH_WAIT_MS = 100  # fetch.wait.max.ms of a process that takes partitions over
# librdkafka keys (aliases included) that a Config field decides: an override naming
# one is refused, so a setting is never silently replaced or dropped.
_FIELD_KEYS = {
    "bootstrap.servers": "bootstrap_servers", "metadata.broker.list": "bootstrap_servers",
    "group.id": "group_id", "auto.offset.reset": "auto_offset_reset",
    "message.timeout.ms": "delivery_timeout", "delivery.timeout.ms": "delivery_timeout",
    "transactional.id": "processing_guarantee", "transaction.timeout.ms": "delivery_timeout",
}


class ClientSettings(Protocol):
    """What the converter reads of a ``kasper_py.config.Config`` (named by shape: the
    config module imports this one)."""

    @property
    def name(self) -> str: ...
    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def input_topics(self) -> Sequence[str]: ...
    @property
    def largest_batch(self) -> int: ...
    @property
    def batch_bytes(self) -> int: ...
    @property
    def max_latency(self) -> float | None: ...
    @property
    def auto_offset_reset(self) -> str: ...
    @property
    def delivery_timeout(self) -> float: ...
    @property
    def client_overrides(self) -> Mapping[str, ClientValue]: ...
    @property
    def consumer_overrides(self) -> Mapping[str, ClientValue]: ...
    @property
    def producer_overrides(self) -> Mapping[str, ClientValue]: ...
    @property
    def exactly_once(self) -> bool: ...
    @property
    def group_mode(self) -> bool: ...
    @property
    def group(self) -> str: ...
    @property
    def transactional_id(self) -> str: ...
    @property
    def num_standby_replicas(self) -> int: ...
    @property
    def admin_port(self) -> int | None: ...
    @property
    def query_port(self) -> int | None: ...
    @property
    def query_host(self) -> str: ...
    @property
    def query_endpoint(self) -> str | None: ...
    @property
    def query_tls_cert(self) -> str | None: ...


def _prefetch(largest_batch: int, batch_bytes: int) -> dict[str, ClientValue]:
    """The consumer's prefetch, for a loop that takes thousands of records at a time.

    librdkafka fetches until a partition's local queue holds ``queued.min.messages``
    records or the consumer's holds ``queued.max.messages.kbytes``, then waits
    ``fetch.queue.backoff.ms`` before fetching that partition again: 1 s by default, so a
    loop that drains the queue a batch at a time stalls on every refill. 10 ms keeps
    the queue topped up at the same memory bound (measured: 0.2M -> 0.95M records/s
    consume-only, see bench/bench_passthrough.py). The bound is librdkafka's 64 MiB of
    prefetched records (plus one fetch response), or two of the largest batches in
    bytes when ``batch_bytes`` is set above 32 MiB, so a full batch is ready when asked
    for; the fetch sizes stay librdkafka's (``fetch.max.bytes`` 50 MiB,
    ``max.partition.fetch.bytes`` 1 MiB a partition), which refill that queue faster
    than the loop empties it."""
    return {"fetch.queue.backoff.ms": 10,
            "queued.min.messages": max(100_000, largest_batch),
            "queued.max.messages.kbytes": min(_MAX_QUEUE_KBYTES,
                                              max(65_536, 2 * batch_bytes // 1024))}


def _linger_ms(max_latency: float) -> float:
    """The producer's ``linger.ms`` for a latency target. The loop hands a turn's whole
    output over at once, so lingering only holds back its last, partial request: 5 ms
    by default, at most a fiftieth of the target with ``max_latency`` (1 ms at 50 ms)."""
    return min(5.0, max_latency * 1000 / 50)


def _group_protocol(protocol: str, topics: int) -> dict[str, ClientValue]:
    """Group mode: Kafka 4's broker-side incremental protocol (KIP-848) with its ``range``
    assignor, which gives partition p of every co-partitioned topic to one member; a
    rebalance moves only the partitions that change owner. With ``group.protocol=classic``
    (brokers before 4.0) the fallback is ``cooperative-sticky`` for one input topic and,
    since that does not co-partition, eager ``range`` for several."""
    if protocol == "classic":
        return {"group.protocol": "classic", "partition.assignment.strategy":
                "cooperative-sticky" if topics == 1 else "range"}
    return {"group.protocol": "consumer", "group.remote.assignor": "range"}


def member_client_id(config: ClientSettings) -> str:
    """A group member's default client id, ``<name>-consumer-<pid>``; with standby
    replicas and a query endpoint known at start, followed by ``;query=<endpoint>``.

    The client id is the one string of a member's own that the group's description
    (``DescribeConsumerGroups``, both protocols) returns, and librdkafka lets no
    assignment user data carry one (Kafka Streams' ``application.server``), so it is
    where a member publishes the endpoint stale queries are routed to: it comes and
    goes with the membership, never outliving a dead member."""
    client_id = f"{config.name}-consumer-{os.getpid()}"
    endpoint = announced_endpoint(config) if config.num_standby_replicas > 0 else None
    return client_id if endpoint is None else f"{client_id}{_ENDPOINT_MARK}{endpoint}"


def endpoint_of_member(client_id: str) -> str | None:
    """The query endpoint a member's client id publishes (``member_client_id``), if any."""
    _, mark, endpoint = client_id.partition(_ENDPOINT_MARK)
    return endpoint or None if mark else None


def consumer_conf(config: ClientSettings) -> dict[str, ClientValue]:
    """librdkafka consumer settings: manual commits of processed offsets only, read
    committed. Precedence as for every client: see ``_client_conf``."""
    defaults: dict[str, ClientValue] = {
        "client.id": f"{config.name}-consumer",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        **_prefetch(config.largest_batch, config.batch_bytes),
    }
    if config.admin_port is not None or config.num_standby_replicas > 0:
        # A partition taken over (a promotion, a group assignment) joins the consumer's
        # next fetch, after the one in flight, which an idle assignment holds at the
        # broker for fetch.wait.max.ms: librdkafka's 500 ms was most of a failover from a
        # warm copy (bench/bench_failover.py). Idle, 100 ms costs ten fetches a second.
        defaults["fetch.wait.max.ms"] = _TAKEOVER_FETCH_WAIT_MS
    if config.group_mode:
        # members are told apart (kasper lag, offsets show) by their client id
        defaults["client.id"] = member_client_id(config)
        protocol = {**config.client_overrides, **config.consumer_overrides}.get(
            "group.protocol", "consumer")
        defaults.update(_group_protocol(str(protocol), len(config.input_topics)))
        # A member that does not consume for this long leaves the group. A turn waits
        # up to delivery_timeout for its acks, so the budget is three of those.
        defaults["max.poll.interval.ms"] = max(300_000, int(3 * config.delivery_timeout * 1000))
    from_fields = {"group.id": config.group, "auto.offset.reset": config.auto_offset_reset}
    return _client_conf(config, defaults, config.consumer_overrides, from_fields)


def producer_conf(config: ClientSettings) -> dict[str, ClientValue]:
    """librdkafka producer settings: acks=all, idempotent, Java-compatible partitioning,
    never asking a broker to create a topic. Precedence as for every client: see
    ``_client_conf``."""
    defaults: dict[str, ClientValue] = {
        "client.id": f"{config.name}-producer",
        "acks": "all",
        "enable.idempotence": True,
        # murmur2 matches the Java client, so keyed outputs land where Java producers
        # would put them and stay co-partitioned with topics those producers write.
        "partitioner": "murmur2_random",
        "linger.ms": 5 if config.max_latency is None else _linger_ms(config.max_latency),
        "queue.buffering.max.messages": 1_000_000,
        # failures still reach the producer's callback; successes cost no callback
        "delivery.report.only.error": True,
        # A send never creates a topic, whatever the broker's auto.create.topics.enable:
        # a typo fails the turn (the turn checks each new topic's metadata first).
        "allow.auto.create.topics": False,
    }
    timeout_ms = int(config.delivery_timeout * 1000)
    if config.exactly_once and config.group_mode:
        # A member killed mid-transaction leaves offsets pending that its partitions'
        # next owner must wait out (each member has its own transactional id, so no
        # successor aborts it): the transaction timeout bounds that wait. librdkafka
        # needs deliveries within it too. Kafka Streams' default is the same 10 s.
        timeout_ms = min(timeout_ms, _GROUP_TRANSACTION_TIMEOUT_MS)
    from_fields: dict[str, ClientValue] = {"message.timeout.ms": timeout_ms}
    if config.exactly_once:
        # A transaction's AddPartitions is refused (CONCURRENT_TRANSACTIONS) until the
        # previous one's markers are written, then retried after retry.backoff.ms: at
        # librdkafka's 100 ms every turn waited ~100 ms; at 10 ms about 15 ms.
        defaults["retry.backoff.ms"] = 10
        from_fields.update({"transactional.id": config.transactional_id,
                            "transaction.timeout.ms": timeout_ms})
    return _client_conf(config, defaults, config.producer_overrides, from_fields)


def admin_conf(config: ClientSettings) -> dict[str, ClientValue]:
    """librdkafka admin client settings (topic metadata, changelog creation, group
    offsets): the connection and ``client_overrides`` only, as ``_client_conf`` says."""
    return _client_conf(config, {"client.id": f"{config.name}-admin"}, {}, {})


def _client_conf(config: ClientSettings, defaults: Mapping[str, ClientValue],
                 own_overrides: Mapping[str, ClientValue],
                 from_fields: Mapping[str, ClientValue]) -> dict[str, ClientValue]:
    """The one precedence rule of every client, later winning: the library's
    ``defaults``, then ``client_overrides``, then the client's own overrides, then
    the keys a field decides (``bootstrap.servers`` and ``from_fields``). Overrides
    naming a field's key are refused at construction, so the last step only makes
    the rule visible; callers add their own keys (a log level, callbacks) on top."""
    return {**defaults, **config.client_overrides, **own_overrides,
            "bootstrap.servers": config.bootstrap_servers, **from_fields}


def checked_overrides(name: str, overrides: object) -> dict[str, ClientValue]:
    """The ``name`` field's librdkafka overrides, checked and copied; their values are
    remembered as possible secrets (scrubbed from logs, errors and CLI output)."""
    if not isinstance(overrides, Mapping):
        raise ConfigError(name, "must be a mapping of librdkafka keys to values")
    for key, value in overrides.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
            raise ConfigError(name, f"{key!r} must map a str key to str/int/float/bool")
    checked = dict(overrides)
    remember_secrets(checked)
    _refuse_field_keys(name, checked)
    return checked


def _refuse_field_keys(name: str, overrides: Mapping[str, ClientValue]) -> None:
    """A key a field decides would lose to the field (see ``_client_conf``): say so."""
    for key in overrides:
        if key in _FIELD_KEYS:
            raise ConfigError(name, f"{key} comes from the {_FIELD_KEYS[key]!r} field: "
                              "set that field instead")


def refuse_unsafe_overrides(config: ClientSettings) -> None:
    """Overrides may tune the clients, never weaken the commit contract."""
    consumer = {**config.client_overrides, **config.consumer_overrides}
    producer = {**config.client_overrides, **config.producer_overrides}
    where = "consumer_overrides"
    if str(consumer.get("enable.auto.commit", "false")).lower() != "false":
        raise ConfigError(where, "enable.auto.commit must stay false: the loop commits")
    isolation = str(consumer.get("isolation.level", "read_committed")).lower()
    if config.exactly_once and isolation != "read_committed":
        raise ConfigError(where, "isolation.level must stay read_committed with "
                          "processing_guarantee='exactly_once'")
    where = "producer_overrides"
    if str(producer.get("acks", "all")).lower() not in ("all", "-1"):
        raise ConfigError(where, "acks must stay 'all' for at-least-once delivery")
    if str(producer.get("enable.idempotence", "true")).lower() != "true":
        raise ConfigError(where, "enable.idempotence must stay true")
