"""kasper_py: process Kafka topics in small batches, Kasper/Samza style.

Subclass ``MessageProcessor``, build a ``Config``, and run a ``TopicProcessor``.
Each turn processes a batch, flushes stores, waits for every output ack, and only
then commits the input offsets: at-least-once, with replays bounded by one batch.
"""

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
