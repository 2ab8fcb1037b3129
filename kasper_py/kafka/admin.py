"""``KafkaAdmin``: the one place kasper_py asks Kafka about a group and its input
outside the loop: cluster metadata, watermarks, the group's committed offsets and
commit notes, offsets for a time, the group's state and members, and altering the
group's offsets; and what ``kasper app reset`` deletes: a group, an app's internal
topics. Used by ``kasper offsets/lag/dlq/app``, the reprocessing handoff, the Spark
stream runner and query routing; and, through ``KafkaAdmin.ensure`` (``admin_topics``),
by everything that creates a topic. Kafka's exceptions become kasper_py's here, once:
``BrokerUnreachableError`` when no broker answers, else ``AdminError`` (or the classes
a front end passes), with Kafka's error code kept. One ``AdminClient`` per process and
connection (``shared_client``), whatever the number of ``KafkaAdmin``s.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kasper_py._support.client_conf import endpoint_of_member
from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import (
    AdminError,
    BrokerUnreachableError,
    ConfigError,
    KasperError,
    TopicError,
)
from kasper_py.kafka.admin_topics import TopicAdmin
from kasper_py.kafka.client_log import with_client_log
from kasper_py.kafka.offsets import GROUP_ACTIVE_ERRORS, CommitNote, PartitionProgress
from kasper_py.kafka.topics import internal_specs, output_specs, source_counts
from kasper_py.message import TopicPartitionKey

__all__ = ["GroupMember", "GroupState", "KafkaAdmin", "close_shared", "ensure_internal_topics",
           "ensure_output_topics", "reason", "topic_admin", "with_inputs_listed"]

UNREACHABLE_ERRORS = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                      KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
"""Error codes that mean no broker answered."""
INPUT_GRACE, INPUT_STEP = 3.0, 0.1
"""Seconds an input topic missing from the metadata is looked for again, this often,
before it is an error (``with_inputs_listed``)."""
_T = TypeVar("_T")


@dataclass(frozen=True)
class GroupMember:
    """A member of the consumer group (group mode) and what it is assigned."""

    client_id: str
    host: str
    partitions: tuple[TopicPartitionKey, ...]

    def describe(self) -> str:
        """``client-id@host``."""
        return f"{self.client_id}@{self.host.lstrip('/')}"

    @property
    def query_endpoint(self) -> str | None:
        """The URL the member answers queries on, as its client id publishes it
        (``;query=<url>``: a member with standby replicas and a query port), else ``None``."""
        return endpoint_of_member(self.client_id)


@dataclass(frozen=True)
class GroupState:
    """The group's state name (``EMPTY``, ``STABLE``...) and its members."""

    state: str
    members: tuple[GroupMember, ...]

    def owners(self) -> dict[TopicPartitionKey, str]:
        """The member holding each assigned topic-partition, described."""
        return {key: m.describe() for m in self.members for key in m.partitions}


class KafkaAdmin(TopicAdmin):
    """An admin client (the process's one for this connection, ``shared_client``) and a
    consumer of ``group`` (default: ``config.group``, the processor's; ``kasper dlq
    replay`` passes its own); the consumer never
    subscribes, so it never joins the group. librdkafka is quiet: the first error it
    reports goes into the exception instead, what it still logs into the JSON log.

    ``failure``/``unreachable`` are the exception classes raised (a front end's own,
    such as ``ReprocessError``); ``read_committed=False`` reads the committed offsets as
    they stand, not waited on while a killed exactly-once loop's transaction is open.
    """

    def __init__(self, config: Config, *, timeout: float = 30.0, client_id: str | None = None,
                 read_committed: bool = True, consumer: bool = True, group: str | None = None,
                 failure: type[KasperError] = AdminError,
                 unreachable: type[KasperError] = BrokerUnreachableError) -> None:
        self._config, self._timeout, self._group = config, timeout, group or config.group
        self._failure, self._unreachable = failure, unreachable
        self._admin, self.errors = shared_client(config)
        """``errors``: what librdkafka reported through ``error_cb``, first first."""
        quiet: dict[str, Any] = {"log_level": 2, "error_cb": self._on_error}
        self._consumer: Any = None
        if consumer:
            conf = {**config.to_consumer_conf(), **quiet,
                    "client.id": client_id or f"{config.name}-admin", "group.id": self._group}
            if not read_committed:
                conf["isolation.level"] = "read_uncommitted"
            self._consumer = _client(Consumer, config, conf, "consumer",
                                     ("consumer_overrides", "client_overrides/consumer_overrides"))

    @property
    def group_id(self) -> str:
        """The group this admin reads and changes."""
        return self._group

    # -- the input -------------------------------------------------------------------

    def metadata(self, topic: str | None = None) -> Any:
        """Cluster metadata (every topic, or ``topic``'s); listing creates no topic."""
        return self._call("reading metadata", self._admin.list_topics, topic,
                          timeout=self._timeout)

    def watermarks(self, keys: Iterable[TopicPartitionKey]
                   ) -> dict[TopicPartitionKey, tuple[int, int]]:
        """(low, high) per partition; high is the last stable offset under read_committed."""
        found = {}
        for topic, partition in keys:
            low, high = self._call(f"reading the watermarks of {topic}[{partition}]",
                                   self._consumer.get_watermark_offsets,
                                   TopicPartition(topic, partition), timeout=self._timeout)
            found[topic, partition] = (int(low), int(high))
        return found

    def offsets_at(self, millis: int, watermarks: Mapping[TopicPartitionKey, tuple[int, int]]
                   ) -> dict[TopicPartitionKey, int]:
        """First offset at or after ``millis`` per partition; the high watermark where
        every message is older (and where records arrived after the watermarks were
        read: the answer stays inside that snapshot). A partition the lookup failed for
        is an error, not "no message that recent"."""
        request = [TopicPartition(t, p, millis) for t, p in sorted(watermarks)]
        found = self._call(f"finding the offsets at {millis} ms",
                           self._consumer.offsets_for_times, request, timeout=self._timeout)
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in found
                  if tp.error is not None]
        if failed:
            raise self._failure(f"finding the offsets at {millis} ms failed for "
                                f"{'; '.join(failed)}")
        return {(tp.topic, tp.partition):
                min(tp.offset, watermarks[tp.topic, tp.partition][1]) if tp.offset >= 0
                else watermarks[tp.topic, tp.partition][1] for tp in found}

    # -- the group -------------------------------------------------------------------

    def committed(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        """The group's committed next offsets (``None`` where nothing is committed)."""
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None
                for tp in self._committed(keys)}

    def commit_notes(self, keys: Iterable[TopicPartitionKey]) -> list[CommitNote | None]:
        """The kasper loop notes stored with the group's committed offsets."""
        return [CommitNote.decode(tp.metadata) for tp in self._committed(keys)]

    def progress(self, keys: Iterable[TopicPartitionKey]) -> list[PartitionProgress]:
        """Committed offset, note and watermarks of each of ``keys``."""
        committed = self._committed(keys)
        marks = self.watermarks((tp.topic, tp.partition) for tp in committed)
        return [PartitionProgress(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else None,
                                  *marks[tp.topic, tp.partition], CommitNote.decode(tp.metadata))
                for tp in committed]

    def _committed(self, keys: Iterable[TopicPartitionKey]) -> Any:
        request = [TopicPartition(t, p) for t, p in keys]
        return self._call(f"reading the offsets of group {self._group!r}",
                          self._consumer.committed, request, timeout=self._timeout)

    def group_notes(self, topic: str, partitions: int) -> dict[int, CommitNote | None]:
        """The notes of ``topic``'s partitions read with the admin client alone
        (``ListConsumerGroupOffsets``), for a caller without a consumer."""
        group = self._group
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, p) for p in range(partitions)])
        futures = self._admin.list_consumer_group_offsets([request],
                                                          request_timeout=self._timeout)
        result = self._call(f"reading the offsets of group {group!r}",
                            next(iter(futures.values())).result, timeout=self._timeout + 5)
        return {tp.partition: CommitNote.decode(getattr(tp, "metadata", None))
                for tp in result.topic_partitions}

    def group(self) -> GroupState:
        """The group's state and its members, with their assignments."""
        group = self._group
        futures = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)
        description = self._call(f"describing group {group!r}", futures[group].result,
                                 timeout=self._timeout + 5)
        return GroupState(description.state.name, tuple(
            GroupMember(m.client_id, m.host, tuple(sorted(
                (tp.topic, tp.partition) for tp in (m.assignment.topic_partitions
                                                    if m.assignment else ()))))
            for m in description.members))

    def group_state(self) -> tuple[str, list[str]]:
        """The group's state (``EMPTY``, ``STABLE``...) and its members' client ids."""
        state = self.group()
        return state.state, [m.client_id for m in state.members]

    def commit(self, offsets: Mapping[TopicPartitionKey, int], note: str | None = None
               ) -> None:
        """Set the group's committed offsets, with ``note`` as their metadata. The broker
        refuses while the group has members: the error's ``code`` is then one of
        ``GROUP_ACTIVE_ERRORS``."""
        group = self._group
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p, o) if note is None
                    else TopicPartition(t, p, o, metadata=note)
                    for (t, p), o in sorted(offsets.items())])
        futures = self._admin.alter_consumer_group_offsets([request],
                                                           request_timeout=self._timeout)
        result = self._call(f"committing the offsets of group {group!r}",
                            futures[group].result, timeout=self._timeout + 5)
        refused = [tp for tp in result.topic_partitions if tp.error is not None]
        if refused:
            codes = [tp.error.code() for tp in refused]
            active = all(code in GROUP_ACTIVE_ERRORS for code in codes)
            code = codes[0] if active or len(set(codes)) == 1 else None
            causes = "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in refused)
            raise self._failure(f"committing the offsets of group {group!r} failed for "
                                f"{causes}", code=code)

    def delete_group(self) -> bool:
        """Delete the group and its committed offsets (``kasper app reset``); ``False``
        when there was no such group. The broker refuses while the group has members:
        the error's ``code`` is then ``NON_EMPTY_GROUP``."""
        group = self._group
        futures = self._admin.delete_consumer_groups([group], request_timeout=self._timeout)
        try:
            self._call(f"deleting group {group!r}", futures[group].result,
                       timeout=self._timeout + 5)
        except KasperError as exc:
            if exc.code == KafkaError.GROUP_ID_NOT_FOUND:
                return False
            raise
        return True

    def close(self) -> None:
        """Close the consumer (it never joined the group, so nothing rebalances)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> KafkaAdmin:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _on_error(self, error: Any) -> None:
        _record(self.errors, error)

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, Kafka's failure raised as kasper_py's; a future
        still pending when its wait ran out (``TimeoutError``) is no broker answering."""
        servers, reported = self._config.bootstrap_servers, len(self.errors)
        try:
            return method(*args, **kwargs)
        except KafkaException as exc:
            self._admin.poll(0)  # serves error_cb, which holds the cause (refused, DNS, TLS)
            # the client is shared: the cause is the first error since this request began
            errors = self.errors[reported:] or self.errors[-1:]
            cause = f" ({errors[0]})" if errors else ""
            code = _code(exc.args[0] if exc.args else exc)
            unreachable = code in UNREACHABLE_ERRORS
            waited = f" within {self._timeout:g}s" if unreachable else ""
            raise (self._unreachable if unreachable else self._failure)(
                f"{what} on {servers} failed{waited}: {reason(exc)}{cause}",
                code=code) from exc
        except TimeoutError as exc:
            raise self._unreachable(f"{what} on {servers}: no answer within "
                                    f"{self._timeout:g}s", code=KafkaError._TIMED_OUT) from exc


def reason(exc: BaseException) -> str:
    """The text of a Kafka exception's error (``KafkaError.str()``)."""
    error = exc.args[0] if exc.args else exc
    return str(error.str() if hasattr(error, "str") else error)


def _code(error: Any) -> int | None:
    code = error.code() if hasattr(error, "code") else None
    return code if isinstance(code, int) else None


# -- one AdminClient per process and connection --------------------------------------------

_SHARED: dict[tuple[tuple[str, str], ...], tuple[Any, list[str]]] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(config: Config) -> tuple[Any, list[str]]:
    """The process's ``AdminClient`` for ``config``'s connection (bootstrap servers,
    security and other client settings; the client id aside), made on first use, and
    the list its ``error_cb`` appends librdkafka's errors to. ``ConfigError`` naming
    the overrides librdkafka refused."""
    conf = config.to_admin_conf()
    key = tuple(sorted((name, repr(value)) for name, value in conf.items()
                       if name != "client.id"))
    with _SHARED_LOCK:
        if key not in _SHARED:
            errors: list[str] = []
            quiet = {"log_level": 2, "error_cb": lambda error: _record(errors, error)}
            client = _client(AdminClient, config, {**conf, **quiet}, "admin",
                             ("client_overrides", "client_overrides"))
            _SHARED[key] = (client, errors)
        return _SHARED[key]


def _record(errors: list[str], error: Any) -> None:
    """Keep librdkafka's ``error`` in ``errors``, the last hundred only: a shared client
    lives as long as the process."""
    errors.append(error.str())
    del errors[:-100]


def close_shared() -> None:
    """Forget the shared clients (at exit; a fork's child makes its own)."""
    with _SHARED_LOCK:
        _SHARED.clear()


def _forget_in_child() -> None:
    """After a fork: the parent's clients (and their threads) are not the child's; the
    lock may have been held by a thread that does not exist here."""
    global _SHARED_LOCK  # noqa: PLW0603 - a fresh lock for the child, once
    _SHARED_LOCK = threading.Lock()
    _SHARED.clear()


atexit.register(close_shared)
os.register_at_fork(after_in_child=_forget_in_child)


def _client(kind: Any, config: Config, conf: dict[str, Any],
            name: Literal["consumer", "admin"], names: tuple[str, str]) -> Any:
    """A client, or ``ConfigError`` naming the overrides librdkafka refused (``names``:
    the field to blame, and the fields as the message names them)."""
    field, fields = names
    try:
        return kind(with_client_log(conf, config.name, name))
    except KafkaException as exc:
        raise ConfigError(field, f"librdkafka refused {fields}: {reason(exc)}") from None


# -- topics: every caller goes through KafkaAdmin.ensure ------------------------------------

def topic_admin(config: Config) -> KafkaAdmin:
    """A ``KafkaAdmin`` without a consumer whose failures are ``TopicError``s: what
    creates and checks topics at start (the loop, the stores, the leader election)."""
    return KafkaAdmin(config, consumer=False, failure=TopicError, unreachable=TopicError)


def ensure_output_topics(config: Config, *, create: bool = True,
                         metadata: Any = None) -> list[str]:
    """Check the declared output topics (``Config.output_topics``) before a processor
    starts: with ``create``, create the absent ones with their partitions, replication
    and settings; without, an absent one is a ``TopicError``. Either way an existing one
    with another partition count is a ``TopicError`` naming both counts. Returns the
    names created. ``metadata`` is read when not given (``kasper run`` passes its own)."""
    if not config.output_topics:
        return []
    admin = topic_admin(config)
    metadata = metadata if metadata is not None else admin.metadata()
    return admin.ensure(output_specs(config, metadata), create=create, metadata=metadata)


def ensure_internal_topics(config: Config, sources: Sequence[str],
                           topics: Sequence[OutputTopic]) -> list[str]:
    """Create the app's internal ``topics`` that are absent, with the partition count of
    the input topics ``sources`` (``topics.internal_specs``), and check the existing
    ones; returns the names created (``KafkaClients.ensure_topics``)."""
    if not topics:
        return []
    admin = topic_admin(config)
    metadata, counts = with_inputs_listed(
        admin.metadata, lambda listed: (listed, source_counts(config, sources, listed)))
    return admin.ensure(internal_specs(counts, topics), metadata=metadata)


def with_inputs_listed(read: Callable[[], Any], check: Callable[[Any], _T]) -> _T:
    """``check`` of the metadata ``read`` gives; while ``check`` raises ``TopicError``
    (an input topic missing), the metadata is read again every ``INPUT_STEP`` seconds,
    for ``INPUT_GRACE`` seconds, then the error is raised: a topic created just before
    the loop starts is not in every broker's metadata at once (a loaded single-node
    KRaft broker answered without it). The live loop's input check and an app's
    internal topics both read their sources' counts through it."""
    deadline = time.monotonic() + INPUT_GRACE
    while True:
        metadata = read()
        try:
            return check(metadata)
        except TopicError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(INPUT_STEP)
