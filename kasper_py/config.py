"""``Config``: the frozen, validated settings of one processor, and ``to_*_conf()``, its
librdkafka settings (consumer, producer and admin client alike), which the one converter
in ``_support/client_conf.py`` writes. Loading from TOML or the environment lives in
the CLI, not here.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

from kasper_py._support.batch_settings import check_batch_settings
from kasper_py._support.client_conf import (
    ClientValue,
    admin_conf,
    checked_overrides,
    consumer_conf,
    producer_conf,
    refuse_unsafe_overrides,
)
from kasper_py._support.partition_sets import partition_label, transactional_id_of
from kasper_py._support.query_settings import Partitioner, check_port, check_query_settings
from kasper_py._support.secrets import MASK, masked_settings
from kasper_py._support.standby_settings import check_standby_settings
from kasper_py.exceptions import ConfigError
from kasper_py.output_topic import OutputTopic, declared_topics
from kasper_py.registry.config import RegistryConfig
from kasper_py.registry.serdes import FORMATS, Field, registry_serde
from kasper_py.serdes import Serde, serde_for

if TYPE_CHECKING:
    from kasper_py.message import Message

__all__ = ["Config", "OutputTopic"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_AUTO_BATCH = 20_000
"""``batch_size=None`` with a latency target: the most messages a batch may take."""
_CLASSIC_BATCH = 1_000
"""``batch_size=None`` with classic batches (``max_latency=None``): Kasper's batch."""
DecodePolicy = Literal["fail", "skip", "dead_letter"]
ProcessPolicy = Literal["fail", "dead_letter"]
Guarantee = Literal["at_least_once", "exactly_once"]
SpanExport = Literal["none", "otlp", "console"]
_DECODE_POLICIES, _PROCESS_POLICIES = get_args(DecodePolicy), get_args(ProcessPolicy)
_GUARANTEES = get_args(Guarantee)
_OTLP_ENDPOINT = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_SERDE_FIELDS: tuple[tuple[str, Field], ...] = (("key_serde", "key"), ("value_serde", "value"))
_FUNCTION_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # module:function


@dataclass(frozen=True, repr=False)
class Config:
    """Settings of one processor. Invalid values raise ``ConfigError`` naming the field."""

    name: str
    """Processor name: the consumer group, the client id, and the prefix of its state."""
    bootstrap_servers: str
    """Kafka bootstrap servers, ``host:port[,host:port...]``."""
    input_topics: Sequence[str]
    """Topics read together; they must have the same partition count (per group of
    ``input_groups``, when set)."""
    input_partitions: Sequence[int] | None = None
    """Partition numbers this process owns across all input topics; ``None`` means all.
    With ``assignment="group"`` the group decides, and this must stay ``None``."""
    assignment: Literal["static", "group"] = "static"
    """``static``: this process owns ``input_partitions``, placed by hand. ``group``: it
    joins the consumer group and owns what the group assigns it (incremental
    rebalances), so processes can come and go; the same partition number of every input
    topic goes to one member."""
    batch_size: int | None = None
    """The largest batch, in messages. ``None`` (the default) chooses: 20,000 with a
    latency target, which sizes each batch itself below it (see ``max_latency``), and
    1,000 with Kasper's classic batches (``max_latency=None``), where a batch is
    released when it holds this many messages..."""
    batch_wait: float = 1.0
    """...or when this many seconds have passed, whichever comes first. With a latency
    target, the longest wait for a first message while idle."""
    max_latency: float | None = 0.05
    """Seconds of end-to-end latency to aim for (50 ms by default). The loop sizes each
    batch itself (``kasper_py.kafka.sizing.BatchController``): under light input a batch
    is released a little after its first message (at most a tenth of the target, less as
    turns take longer); when input backs up it doubles, or jumps to what waits, for as
    long as a turn stays within ten targets (0.5 s), up to ``batch_size`` messages and
    ``batch_bytes``, and past what 6 MiB of the loop's memory holds only where larger
    batches send fewer outputs per input (``sizing.CoalescingProbe``). The producer's
    ``linger.ms`` is lowered to suit (see
    ``to_producer_conf``). ``None`` (``"none"`` in TOML, flags and variables): Kasper's
    classic batches of ``batch_size`` or ``batch_wait``, the fewest turns under light
    input (docs/performance.md compares)."""
    batch_bytes: int = 16 * 1024 * 1024
    """With a latency target, the largest batch in bytes of keys and values (16 MiB),
    estimated from every eighth record as it is read: a batch is released once it holds
    this much, and sized to hold about this much, so large messages make batches of
    fewer. Classic batches (``max_latency=None``) count messages only."""
    max_task_idle: float | None = 0.0
    """With two input topics or more (co-partitioned), each batch takes partition P's
    records in timestamp order across the topics: up to the lowest of the newest
    timestamps read of P in each topic; the rest waits for the next batch. An input of
    P with nothing read holds P back while records of it are known (or not yet known)
    to wait on the broker, however long that takes (a wait past 5 s is logged), and
    while it is caught up for this many seconds (0, the default: not at all; Kafka
    Streams' ``max.task.idle.ms``). ``None`` (``"none"``): no alignment, a batch is
    whatever was read."""
    idle_advance: float | None = None
    """Seconds of wall clock after which a partition with no new record has its stream
    time advanced (``None``, the default: stream time moves with records only): from
    then on its stream time is the one it had at its last record plus the wall-clock
    time since, so stream-time timers fire (and windows close through them) on quiet
    input; a later record older than that is late (see time-and-windows.md)."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where to start on a partition that has no committed offset."""
    key_serde: str | Serde = "bytes"
    """Decodes input keys and encodes output keys, as ``value_serde``."""
    value_serde: str | Serde = "bytes"
    """Decodes input values and encodes output values: ``bytes``, ``str``, ``json``, a
    registry format (``avro``, ``protobuf``, ``json_schema``: needs ``registry``) or a Serde."""
    registry: RegistryConfig | Mapping[str, Any] | str | None = None
    """The schema registry of the ``avro``/``protobuf``/``json_schema`` serdes: a
    ``RegistryConfig``, a ``[registry]`` table of its fields (``url``, ``basic_auth``,
    ``subject_strategy``, ``auto_register``, ``use_latest_version``, ``key_schema``,
    ``value_schema``), or its URL alone; ``None``: no registry."""
    group_id: str | None = None
    """Consumer group for the committed offsets; defaults to ``name``."""
    delivery_timeout: float = 120.0
    """Seconds to wait for every output message's ack before the turn fails. With
    ``exactly_once`` it is also the transaction timeout: how long a crashed loop's open
    transaction holds back ``read_committed`` readers if no process takes over."""
    repartition_purge_interval: float = 30.0
    """Seconds between purges of an app's repartition topics: the records the
    downstream stage committed are deleted (``kasper_py.kafka.purge``; Kafka Streams'
    ``repartition.purge.interval.ms``)."""
    processing_guarantee: Guarantee = "at_least_once"
    """``at_least_once``: a crash replays the uncommitted batch (duplicates bounded by
    one batch). ``exactly_once``: each turn is one Kafka transaction (outputs, table
    changelogs and input offsets), so ``read_committed`` readers see every input's
    effects once; a second loop on the same partitions fences the first."""
    state_dir: str = "kasper-state"
    """Folder under which local RocksDB tables keep one database per partition."""
    num_standby_replicas: int = 0
    """Warm copies of each partition's local tables kept in other processes, which tail
    the changelogs (docs/stores.md, standby replicas): ``kasper run --processes N``
    places them over its workers (static assignment); in group mode each member keeps
    warm what the group placement gives it, and promotes a copy in place when assigned
    its partition."""
    standby_partitions: Sequence[int] | None = None
    """Partitions whose local tables this process keeps warm (static assignment); ``None``:
    none, unless placed for you as ``num_standby_replicas`` says."""
    admin_port: int | None = None
    """Port of the loop's admin endpoint (``POST /standby/promote``: a static standby
    takes its partitions over in place; ``POST /standby/release``: it gives them back),
    bound on 127.0.0.1 only; ``None`` (the default) serves none (docs/stores.md,
    promoting a standby)."""
    metrics_port: int | None = None
    """Port serving ``/metrics`` and ``/health``; ``None`` disables the exporter."""
    metrics_host: str = "0.0.0.0"
    """The address the metrics server binds: every interface by default, as Prometheus
    expects (metrics carry counts and timings, never the application's state)."""
    tracing: SpanExport = "none"
    """OpenTelemetry spans of every turn (the ``otel`` extra; docs/operations.md): ``otlp``
    exports them over OTLP/HTTP, ``console`` prints them, ``none`` traces nothing. Their
    service name is ``name`` unless ``OTEL_SERVICE_NAME`` is set."""
    otlp_endpoint: str | None = None
    """The OTLP/HTTP collector's base URL (spans go to ``<url>/v1/traces``); ``None``: the
    SDK's ``OTEL_EXPORTER_OTLP_ENDPOINT``, else ``http://localhost:4318``."""
    query_port: int | None = None
    """Port serving the tables and views (``/tables``, your views) to ``QueryClient``,
    ``kasper query`` and other instances' redirects; ``None`` (the default) serves
    them over no HTTP at all (``TopicProcessor.tables`` still reads them in-process).
    A server of its own, apart from the metrics: state is not public by default."""
    query_host: str = "127.0.0.1"
    """The address the query server binds: loopback unless you choose another (an
    interface's address, or ``0.0.0.0`` for all), so the application's state is never
    open to the network by accident. Beyond loopback, set ``query_token`` (and TLS)."""
    query_token: str | None = None
    """A secret: when set, every request to the query server must carry
    ``Authorization: Bearer <token>`` (compared in constant time), else 401. Give every
    instance of a processor the same token; masked in ``repr``, logs and errors."""
    query_tls_cert: str | None = None
    """PEM certificate (chain) file: serve the queries over HTTPS; needs
    ``query_tls_key``."""
    query_tls_key: str | None = None
    """PEM private key file of ``query_tls_cert``."""
    query_partitioner: Partitioner = "murmur2"
    """How the producers of the input topics partition by key, so a query finds the
    partition (and the instance) holding a key: ``murmur2`` (the default) is what
    kasper_py's own producer writes with (``partitioner=murmur2_random``), and the Java
    client's default (Kafka Streams, Connect, Spring); ``crc32`` is librdkafka's default
    ``consistent_random`` (a plain confluent-kafka, Go or .NET producer)."""
    query_endpoint: str | None = None
    """The URL other instances redirect key queries to, announced in the commit note
    (and, by a group member with ``num_standby_replicas``, in its client id, where stale
    lookups find the members keeping a partition warm); defaults to
    ``http(s)://<query_host>:<query port>`` (the hostname when ``query_host`` is a
    wildcard such as ``0.0.0.0``)."""
    on_decode_error: DecodePolicy = "fail"
    """An input message whose key or value does not decode: ``fail`` stops the loop
    uncommitted; ``skip`` leaves it out of ``process()`` (logged, counted, committed);
    ``dead_letter`` also produces its original bytes to ``dead_letter_topic``."""
    on_process_error: ProcessPolicy = "fail"
    """``process()`` raising on a partition's batch: ``fail`` stops the loop uncommitted;
    ``dead_letter`` finds the messages it fails on by bisection (that partition's
    pending store writes and output are dropped, its processor is rebuilt from the
    factory, and halves are retried), produces each to ``dead_letter_topic`` with its
    original bytes and the error, and applies every other message's effects once.
    A ``KasperError`` other than ``SerdeError`` (a store or Kafka failure) still fails
    the turn, as does a timer, a task or the timestamp extractor raising."""
    dead_letter_topic: str | None = None
    """Where ``dead_letter`` policies send their messages; required by either."""
    output_topics: Sequence[OutputTopic] = ()
    """Output topics the processor declares, with their partition count and settings
    (``OutputTopic``; a TOML table or ``"name[:partitions]"`` is taken too). Sending
    needs no declaration, and never creates a topic: the first send to a topic that does
    not exist fails the turn. ``kasper run --create-topics`` creates the declared ones
    that are absent; every ``kasper run`` checks the existing ones' partition counts."""
    dead_letter_max_per_turn: int | None = 100
    """``on_process_error="dead_letter"``: more messages than this failing ``process()``
    in one turn stop the loop uncommitted (``DeadLetterLimitError``); ``None``: no
    limit. The default bounds the cost of bisection (about 2 retries per message of
    a batch where everything fails)."""
    dead_letter_max_per_minute: int | None = 1000
    """...more than this in the last 60 seconds (this process, every partition, counting
    the turn's own) stop it too; ``None``: no limit."""
    dead_letter_max_ratio: float | None = None
    """...dead letters over messages processed in the last 60 seconds above this ratio
    (0 < ratio <= 1) stop it too; ``None`` (the default): no limit. A rate, not a count:
    at low input one dead letter among a few messages exceeds it."""
    timestamp_extractor: str | Callable[[Message], int | None] | None = None
    """The event time of an input message (``ProcessorContext.event_time``): a function
    of the decoded ``Message`` returning milliseconds since the epoch (an int), or
    ``None`` for its Kafka timestamp; or that function's ``"module:function"`` name,
    which works from TOML and is imported where the turns run (Spark executors
    included; checked when the ``TopicProcessor`` or driver is built). ``None``: the
    Kafka timestamp."""
    async_concurrency: int = 64
    """``AsyncMessageProcessor``: the most of its calls in flight at once in this process,
    every partition together (``kasper_py.aio``)."""
    async_timeout: float | None = None
    """``AsyncMessageProcessor``: seconds a batch's coroutines may take together; past
    them the batch fails with a ``TimeoutError`` (uncommitted, or ``on_process_error``'s
    way). ``None`` (``"none"``): no limit."""
    client_overrides: Mapping[str, ClientValue] = field(default_factory=dict)
    """librdkafka settings applied to every client: consumer, producer, admin (e.g. SASL)."""
    consumer_overrides: Mapping[str, ClientValue] = field(default_factory=dict)
    """librdkafka settings for the consumer only."""
    producer_overrides: Mapping[str, ClientValue] = field(default_factory=dict)
    """librdkafka settings for the producer only."""
    input_groups: Sequence[Sequence[str]] | None = None
    """The input topics in groups read together (co-partitioned): each group's topics
    share a partition count, groups may differ, and the loop runs partition numbers up
    to the largest count, each reading the topics that have it. ``None``: every input
    topic is one group. An app's plan sets it from what each processor reads."""

    def __post_init__(self) -> None:
        self._check_identity()
        self._check_topics()
        self._check_assignment()
        self._set("standby_partitions", check_standby_settings(self))
        check_batch_settings(self)
        self._check_serdes()
        self._check_dead_letters()
        self._check_outputs()
        self._check_modes()
        self._check_timestamp_extractor()
        self._check_overrides()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_identity(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError("name", f"must match {_NAME.pattern}, got {self.name!r}")
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers", "must be a non-empty 'host:port' list")
        if self.group_id is not None and not (isinstance(self.group_id, str) and self.group_id):
            raise ConfigError("group_id", f"must be a non-empty string, got {self.group_id!r}")
        if not isinstance(self.state_dir, str) or not self.state_dir:
            raise ConfigError("state_dir", "must be a non-empty path")
        check_port("metrics_port", self.metrics_port)
        check_port("admin_port", self.admin_port)
        if not isinstance(self.metrics_host, str) or not self.metrics_host.strip():
            raise ConfigError("metrics_host",
                              f"must be an address to bind, got {self.metrics_host!r}")
        endpoint = check_query_settings(self)
        if endpoint is not None:
            self._set("query_endpoint", endpoint)

    def _check_topics(self) -> None:
        topics = self.input_topics
        if isinstance(topics, str) or not isinstance(topics, Sequence) or not topics:
            raise ConfigError("input_topics", "must be a non-empty list of topic names")
        for topic in topics:
            if not isinstance(topic, str) or not topic:
                raise ConfigError("input_topics", f"invalid topic name {topic!r}")
        if len(set(topics)) != len(topics):
            raise ConfigError("input_topics", f"lists a topic twice: {list(topics)}")
        self._set("input_topics", tuple(topics))
        self._check_input_groups()
        partitions = self.input_partitions
        if partitions is None:
            return
        if isinstance(partitions, str) or not isinstance(partitions, Sequence) or not partitions:
            raise ConfigError("input_partitions", "must be a non-empty list of ints, or None")
        for partition in partitions:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise ConfigError("input_partitions", f"invalid partition {partition!r}")
        if len(set(partitions)) != len(partitions):
            raise ConfigError("input_partitions", f"lists a partition twice: {list(partitions)}")
        self._set("input_partitions", tuple(sorted(partitions)))

    def _check_input_groups(self) -> None:
        groups = self.input_groups
        if groups is None:
            return
        listed = [t for group in groups for t in group] if isinstance(groups, Sequence) else []
        if (isinstance(groups, str) or not listed or any(isinstance(g, str) for g in groups)
                or set(listed) != set(self.input_topics)):
            raise ConfigError("input_groups", "must be lists of input topics covering every "
                              f"one of {list(self.input_topics)}, or None; got {groups!r}")
        self._set("input_groups", tuple(tuple(g) for g in groups))

    def _check_assignment(self) -> None:
        if self.assignment not in ("static", "group"):
            raise ConfigError("assignment", f"must be 'static' or 'group', got {self.assignment!r}")
        if self.assignment == "group" and self.input_partitions is not None:
            raise ConfigError("input_partitions", "must be None with assignment='group': the "
                              "group assigns the partitions")

    def _check_serdes(self) -> None:
        if self.registry is not None:
            self._set("registry", RegistryConfig.of(self.registry))
        for name, part in _SERDE_FIELDS:
            self._set(name, self._resolved_serde(name, getattr(self, name), part))

    def _resolved_serde(self, name: str, spec: str | Serde, part: Field) -> Serde:
        """``spec`` (a serde's name, a registry format or a ``Serde``) resolved; a bad one
        raises ``ConfigError`` naming field ``name``."""
        if isinstance(spec, str) and spec in FORMATS:
            registry = self.registry if isinstance(self.registry, RegistryConfig) else None
            try:
                return registry_serde(spec, registry, part)
            except ConfigError as exc:  # named for the serde's part: name the field given
                raise ConfigError(name, exc.problem) from None
        try:
            return serde_for(spec)
        except ValueError as exc:
            raise ConfigError(name, f"{exc} (or avro, protobuf, json_schema)") from None

    def _check_dead_letters(self) -> None:
        decode, process, topic = self.on_decode_error, self.on_process_error, self.dead_letter_topic
        if decode not in _DECODE_POLICIES:
            raise ConfigError("on_decode_error",
                              f"must be one of {', '.join(_DECODE_POLICIES)}, got {decode!r}")
        if process not in _PROCESS_POLICIES:
            raise ConfigError("on_process_error",
                              f"must be one of {', '.join(_PROCESS_POLICIES)}, got {process!r}")
        if topic is not None and not (isinstance(topic, str) and topic):
            raise ConfigError("dead_letter_topic", f"must be a topic name, got {topic!r}")
        users = [f"{name}='dead_letter'" for name, policy in
                 (("on_decode_error", decode), ("on_process_error", process))
                 if policy == "dead_letter"]
        if users and topic is None:
            raise ConfigError("dead_letter_topic", f"is required by {' and '.join(users)}")
        if not users and topic is not None:
            raise ConfigError("dead_letter_topic", "is only used when on_decode_error or "
                              "on_process_error is 'dead_letter', but on_decode_error is "
                              f"{decode!r} and on_process_error is {process!r}")
        if topic in self.input_topics:
            raise ConfigError("dead_letter_topic", f"{topic!r} is an input topic: dead "
                              "letters would come back as input")
        self._check_dead_letter_limits()

    def _check_dead_letter_limits(self) -> None:
        for name in ("dead_letter_max_per_turn", "dead_letter_max_per_minute"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ConfigError(name, f"must be an int >= 0 (0: none allowed) or None, "
                                  f"got {value!r}")
        ratio = self.dead_letter_max_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float)
                                  or not 0 < ratio <= 1):
            raise ConfigError("dead_letter_max_ratio",
                              f"must be a number in (0, 1] or None, got {ratio!r}")

    def _check_outputs(self) -> None:
        self._set("output_topics", declared_topics(self.output_topics, lambda spec: (
            self._resolved_serde("output_topics", spec, "value"))))

    def _check_modes(self) -> None:
        if self.processing_guarantee not in _GUARANTEES:
            raise ConfigError("processing_guarantee", f"must be one of {', '.join(_GUARANTEES)}"
                              f", got {self.processing_guarantee!r}")
        if self.tracing not in get_args(SpanExport):
            raise ConfigError("tracing", f"must be one of {', '.join(get_args(SpanExport))}, "
                              f"got {self.tracing!r}")
        url = self.otlp_endpoint
        if url is not None and not (isinstance(url, str) and _OTLP_ENDPOINT.match(url)):
            raise ConfigError("otlp_endpoint", f"must be an http(s) URL, got {url!r}")

    def _check_timestamp_extractor(self) -> None:
        extractor = self.timestamp_extractor
        if extractor is None or callable(extractor):
            return
        if not isinstance(extractor, str) or not _FUNCTION_NAME.match(extractor):
            raise ConfigError("timestamp_extractor", "must be a function of a Message, or its "
                              f"name as 'module:function', got {extractor!r}")

    def _check_overrides(self) -> None:
        for name in ("client_overrides", "consumer_overrides", "producer_overrides"):
            self._set(name, checked_overrides(name, getattr(self, name)))
        refuse_unsafe_overrides(self)
    @property
    def exactly_once(self) -> bool:
        """True when ``processing_guarantee`` is ``exactly_once``."""
        return self.processing_guarantee == "exactly_once"

    @property
    def group_mode(self) -> bool:
        """True when ``assignment`` is ``group``."""
        return self.assignment == "group"

    @property
    def largest_batch(self) -> int:
        """The most messages one batch may take: ``batch_size``, or when it is ``None``
        20,000 with a latency target and 1,000 without. The Spark runners, which read
        history in fixed batches, take this many at a time."""
        if self.batch_size is not None:
            return self.batch_size
        return _CLASSIC_BATCH if self.max_latency is None else _AUTO_BATCH

    @property
    def partition_set(self) -> str:
        """This process's input partitions as a label: ``all``, ranges like ``0-3,7``, or
        in group mode ``group-<host>-<pid>`` (what the group assigns changes)."""
        if self.group_mode:
            return f"group-{socket.gethostname()}-{os.getpid()}"
        if self.input_partitions is None:
            return "all"
        return partition_label(self.input_partitions)

    @property
    def transactional_id(self) -> str:
        """``<name>@<partition set>``: the exactly-once producer's id. A second process with
        the same name and partitions gets the same id, and so fences the first. In group
        mode each process has its own; the group's generation fences a zombie instead."""
        return transactional_id_of(self.name, self.partition_set)

    @property
    def group(self) -> str:
        """The consumer group that holds this processor's committed offsets."""
        return self.group_id or self.name

    @property
    def key_decoder(self) -> Serde:
        """The key serde, resolved (``key_serde`` may be given as a name)."""
        return serde_for(self.key_serde)

    @property
    def value_decoder(self) -> Serde:
        """The value serde, resolved (``value_serde`` may be given as a name)."""
        return serde_for(self.value_serde)

    def to_consumer_conf(self) -> dict[str, ClientValue]:
        """librdkafka consumer settings: manual commits of processed offsets only, read
        committed (``kasper_py._support.client_conf``, with its precedence rule)."""
        return consumer_conf(self)

    def to_producer_conf(self) -> dict[str, ClientValue]:
        """librdkafka producer settings: acks=all, idempotent, Java-compatible partitioning,
        never asking a broker to create a topic (``kasper_py._support.client_conf``)."""
        return producer_conf(self)

    def to_admin_conf(self) -> dict[str, ClientValue]:
        """librdkafka admin client settings (topic metadata, changelog creation, group
        offsets): the connection and ``client_overrides`` only."""
        return admin_conf(self)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_overrides"):
                value = masked_settings(value)
            elif f.name == "query_token" and value is not None:
                value = MASK
            elif isinstance(value, Serde):
                value = value.name
            parts.append(f"{f.name}={value!r}")
        return f"Config({', '.join(parts)})"

