"""The exceptions kasper_py raises; users catch these, never confluent_kafka's.

    KasperError
    ├── ConfigError          a Config field (or a TOML/env value) is invalid
    ├── TopicError           a topic or input partition is missing, or partition counts differ
    ├── SerdeError           a key or value could not be decoded or encoded
    ├── RegistryUnavailableError  the schema registry did not answer (or failed: 5xx)
    ├── ProcessingError      process(), a timer, a task or the timestamp extractor raised
    │   └── DeadLetterLimitError    on_process_error="dead_letter": too many dead letters
    ├── ConsumeError         the consumer returned an error for a partition
    ├── ProduceError         an output or changelog message was not delivered
    ├── CommitError          the offset commit (or the transaction's commit) failed
    ├── FencedError          exactly-once: a newer process took over these partitions
    ├── AlreadyRunningError  another loop (or a stream) is running on these partitions now
    ├── OffsetError          an offset would move backwards
    ├── StoreError           a state store operation failed
    │   └── StoreUnavailableError   the store server could not be reached
    ├── RestoreError         a changelog restore did not complete
    ├── QueryError           a query was not answered (``status``: its HTTP status)
    │   ├── BadQueryError          400: a bad key or parameter, or a scan the store can't do
    │   ├── UnauthorizedError      401: no bearer token, or the wrong one
    │   ├── NotFoundError          404: nothing there
    │   │   ├── UnknownTableError      no queryable table of that name
    │   │   └── KeyNotFoundError       no value for the key
    │   ├── NotHereError           421: another instance holds the key (``endpoint``)
    │   └── QueryUnavailableError  503: the partition is not open here now, or its store is down
    ├── AdminError           a Kafka admin request (metadata, group offsets, watermarks,
    │   │                    offsets for a time, altering offsets) failed
    │   └── BrokerUnreachableError  no broker answered in time
    ├── ReprocessError       a reprocessing job or its handoff failed
    └── StreamError          a streaming query on Spark was refused or failed

    SimulatedCrash (a BaseException)   kasper_py.testing's injected "kill -9"
    UnknownStoreError (a KeyError)     context.store(name) of a store nobody declared: a
                                       bug in the processor, so process() raising it is a
                                       ProcessingError like any other

Every error raised from a turn of the loop says which batch was left
uncommitted (partitions and offset ranges) and chains the original cause.
"""

from __future__ import annotations

__all__ = [
    "AdminError",
    "AlreadyRunningError",
    "BadQueryError",
    "BrokerUnreachableError",
    "CommitError",
    "ConfigError",
    "ConsumeError",
    "DeadLetterLimitError",
    "FencedError",
    "KasperError",
    "KeyNotFoundError",
    "NotFoundError",
    "NotHereError",
    "OffsetError",
    "ProcessingError",
    "ProduceError",
    "QueryError",
    "QueryUnavailableError",
    "RegistryUnavailableError",
    "ReprocessError",
    "RestoreError",
    "SerdeError",
    "SimulatedCrash",
    "StoreError",
    "StoreUnavailableError",
    "StreamError",
    "TopicError",
    "UnauthorizedError",
    "UnknownStoreError",
    "UnknownTableError",
]


class KasperError(Exception):
    """Root of every error kasper_py raises.

    ``code`` keeps the Kafka error code (``confluent_kafka.KafkaError.code()``)
    when the cause came from Kafka, else ``None``.
    """

    def __init__(self, message: str, *, code: int | None = None,
                 retriable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable
        """Exactly-once: the turn's transaction was aborted for a reason Kafka calls
        transient, so the loop may run the turn again from the committed offsets."""
        self.uncommitted: str | None = None
        """The batch left uncommitted (partitions and offset ranges), when raised by a turn."""

    def __str__(self) -> str:
        text = super().__str__()
        if self.uncommitted:
            return f"{text} [batch not committed: {self.uncommitted}]"
        return text


class ConfigError(KasperError, ValueError):
    """A configuration value is invalid; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"config field {field!r}: {problem}")
        self.field = field
        self.problem = problem


class TopicError(KasperError):
    """An input topic or input partition is missing, or the input topics disagree on
    their partition count (``kasper_py.kafka.topics`` checks them for every runner); a turn
    sent to a topic that does not exist (nothing of it was produced); or a declared
    output topic is absent, has another partition count, or could not be created."""


class SerdeError(KasperError):
    """A key or value could not be decoded (input) or encoded (output)."""


class RegistryUnavailableError(KasperError):
    """The schema registry did not answer, or failed (HTTP 5xx), while a registry serde
    encoded or decoded: not the record's fault, so not handled by ``on_decode_error``;
    the turn fails uncommitted."""


class ProcessingError(KasperError):
    """``MessageProcessor.process()``, a timer callback, a scheduled task or the timestamp
    extractor raised; the turn was not committed."""

    def __init__(self, message: str, *, partition: int | None) -> None:
        super().__init__(message)
        self.partition = partition
        """The partition whose processor (or timer) raised; ``None`` for a task."""

    @classmethod
    def raised(cls, partition: int, exc: BaseException, offsets: str) -> ProcessingError:
        """``process()`` of ``partition`` raised ``exc`` over ``offsets`` (the batch's
        ``describe()``); the loop, the Spark task and the testing driver word it alike."""
        notes = "".join(f" [{note}]" for note in getattr(exc, "__notes__", ()))
        return cls(f"process() of partition {partition} raised {type(exc).__name__}: {exc}"
                   f"{notes} ({offsets})", partition=partition)


class DeadLetterLimitError(ProcessingError):
    """``on_process_error="dead_letter"``: the messages ``process()`` failed on passed a
    limit (``Config.dead_letter_max_per_turn``, ``..._per_minute`` or ``..._ratio``), so
    the failures look systematic rather than a few poison messages; the turn was not
    committed and the loop stops. ``limit`` names the Config field."""

    def __init__(self, message: str, *, partition: int | None, limit: str) -> None:
        super().__init__(message, partition=partition)
        self.limit = limit
        """The Config field whose limit was passed, e.g. ``dead_letter_max_per_turn``."""


class ConsumeError(KasperError):
    """The consumer reported an error for an input partition."""


class ProduceError(KasperError):
    """A message was not delivered; the batch was not committed."""


class CommitError(KasperError):
    """Committing input offsets failed; the batch will be replayed."""


class FencedError(KasperError):
    """Exactly-once: a newer process took over, so this one may write nothing more. In
    static mode, another producer with this loop's transactional id (the same processor
    name and partition set) started, and aborts this one's open transaction; in group
    mode (one transactional id per process) the group's generation moved on, after a
    rebalance gave this member's partitions to another. The loop stops without
    committing."""


class AlreadyRunningError(KasperError):
    """Another loop is running on these input partitions (its commit note says so, and
    it is recent). Two loops would both process and both commit; pass ``force`` to
    start anyway."""


class OffsetError(KasperError):
    """An offset would move backwards: a reordering bug made loud."""


class StoreError(KasperError):
    """A state store operation failed; the batch was not committed."""


class StoreUnavailableError(StoreError):
    """The store server could not be reached after the configured retries."""


class UnknownStoreError(KeyError):
    """``ProcessorContext.store(name)`` of a store that was not declared. A ``KeyError``,
    as it always was, not a ``KasperError``: the processor's bug, not a store failure."""

    def __str__(self) -> str:  # a KeyError quotes its message: keep it readable
        return str(self.args[0]) if self.args else ""


class RestoreError(KasperError):
    """Restoring a local table from its changelog did not complete."""


class AdminError(KasperError):
    """A Kafka admin request failed (``kasper_py.kafka.admin``); ``code`` is Kafka's."""


class BrokerUnreachableError(AdminError):
    """No broker answered an admin request in time (refused, DNS, TLS, SASL...)."""


class ReprocessError(KasperError):
    """A reprocessing job, its range, or its offset handoff failed."""


class StreamError(KasperError):
    """A streaming query on Spark (``kasper_py.stream``) was refused at start (bad
    arguments, a RocksDB table, a stale checkpoint) or failed while running."""


class QueryError(KasperError):
    """An interactive query (``kasper_py.query``) was not answered; ``status`` is the
    HTTP status the server answers it with."""

    status = 500


class BadQueryError(QueryError):
    """A key that does not parse with the table's key serde, a bad parameter, or a scan
    the table's backend cannot do (the message says why)."""

    status = 400


class UnauthorizedError(QueryError):
    """The query server asks for a bearer token (``Config.query_token``) and the request
    carried none, or another one."""

    status = 401


class NotFoundError(QueryError):
    """Nothing at that address."""

    status = 404


class UnknownTableError(NotFoundError):
    """No queryable table of that name on this processor."""


class KeyNotFoundError(NotFoundError):
    """The table holds no value for the key. ``standby_lag``: the copy asked was a
    standby's (``?stale=ok``), this many changelog offsets behind its owner's, so the key
    may exist and not have reached it yet; ``None`` when the owner's table answered."""

    def __init__(self, message: str, *, standby_lag: int | None = None) -> None:
        super().__init__(message)
        self.standby_lag = standby_lag


class NotHereError(QueryError):
    """Another instance holds the key's partition. ``endpoint`` is its announced URL, or
    ``None`` when no running instance announced one."""

    status = 421

    def __init__(self, message: str, *, partition: int, endpoint: str | None) -> None:
        super().__init__(message)
        self.partition = partition
        self.endpoint = endpoint


class QueryUnavailableError(QueryError):
    """The table's partition is not open here right now (restoring, or moving in a
    rebalance), or its store could not be reached; ask again."""

    status = 503


class SimulatedCrash(BaseException):
    """Raised only by ``kasper_py.testing``'s fault injection: the loop stops at once, as
    a killed process would, committing nothing and closing nothing. Not a KasperError
    (and not an Exception), so no handler of the library or the user catches it."""
