"""kasper_py: process Kafka topics in small batches, Kasper/Samza style.

Subclass ``MessageProcessor``, build a ``Config``, and run a ``TopicProcessor``.
Each turn processes a batch, flushes stores, waits for every output ack, and only
then commits the input offsets: at-least-once, with replays bounded by one batch.

Importing the package imports none of its modules: each name below is imported on
first use (``__getattr__``, as pydantic does), so ``kasper`` can install its signal
handlers before the half second the library's imports take.
"""

import typing as _typing

from kasper_py._support.lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from kasper_py.aio import AsyncMessageProcessor
    from kasper_py.config import Config, OutputTopic
    from kasper_py.exceptions import (
        CommitError,
        ConfigError,
        ConsumeError,
        DeadLetterLimitError,
        KasperError,
        OffsetError,
        ProcessingError,
        ProduceError,
        ReprocessError,
        RestoreError,
        SerdeError,
        StoreError,
        StoreUnavailableError,
        StreamError,
        TopicError,
    )
    from kasper_py.message import (
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        TIMESTAMP_NONE,
        Message,
        OutgoingMessage,
    )
    from kasper_py.processor import MessageProcessor, ProcessorContext, ProcessorFactory
    from kasper_py.sender import Sender
    from kasper_py.serdes import BYTES, JSON, STRING, Serde
    from kasper_py.time import Task, Timer
    from kasper_py.topic_processor import TopicProcessor

__all__ = [
    "BYTES",
    "JSON",
    "STRING",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NONE",
    "AsyncMessageProcessor",
    "CommitError",
    "Config",
    "ConfigError",
    "ConsumeError",
    "DeadLetterLimitError",
    "KasperError",
    "Message",
    "MessageProcessor",
    "OffsetError",
    "OutgoingMessage",
    "OutputTopic",
    "ProcessingError",
    "ProcessorContext",
    "ProcessorFactory",
    "ProduceError",
    "ReprocessError",
    "RestoreError",
    "Sender",
    "Serde",
    "SerdeError",
    "StoreError",
    "StoreUnavailableError",
    "StreamError",
    "Task",
    "Timer",
    "TopicError",
    "TopicProcessor",
]

__version__ = "0.1.0"

_HOMES = {
    "kasper_py.aio": "AsyncMessageProcessor",
    "kasper_py.config": "Config OutputTopic",
    "kasper_py.exceptions": "CommitError ConfigError ConsumeError DeadLetterLimitError "
                            "KasperError OffsetError ProcessingError ProduceError "
                            "ReprocessError RestoreError SerdeError StoreError "
                            "StoreUnavailableError StreamError TopicError",
    "kasper_py.message": "TIMESTAMP_CREATE_TIME TIMESTAMP_LOG_APPEND_TIME TIMESTAMP_NONE "
                         "Message OutgoingMessage",
    "kasper_py.processor": "MessageProcessor ProcessorContext ProcessorFactory",
    "kasper_py.sender": "Sender",
    "kasper_py.serdes": "BYTES JSON STRING Serde",
    "kasper_py.time": "Task Timer",
    "kasper_py.topic_processor": "TopicProcessor",
}
"""The module each name of ``__all__`` is imported from (as the imports above say)."""

# a public name is imported from its module on first use (then kept here)
__getattr__, __dir__ = _lazy_names(__name__, _HOMES, __all__)
