"""Columnar batches: a partition's batch as an Arrow table (``to_arrow``), output sent
from an Arrow table or a Polars frame (``send_table``), and ``ArrowMessageProcessor``,
which receives the table. Needs the ``arrow`` extra (pyarrow); nothing else imports it.
"""

from __future__ import annotations

import importlib
import json
import operator
from abc import abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, overload

from kasper_py.message import Message
from kasper_py.processor import MessageProcessor
from kasper_py.serdes import JSON

if TYPE_CHECKING:
    from kasper_py.sender import Sender

__all__ = ["META_COLUMNS", "ArrowMessageProcessor", "TableBatch", "arrow_table", "import_pyarrow",
           "json_values", "message_columns_of", "send_table", "to_arrow"]

META_COLUMNS = ("topic", "partition", "offset", "timestamp", "key")
"""The columns every table has, before the value's."""


def import_pyarrow() -> Any:
    """pyarrow (with its JSON reader), imported on first use; a missing install says
    which extra brings it. Imported by name: pyarrow ships no type stubs, so mypy's
    strict mode stays as is."""
    try:
        pa = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.json")
    except ImportError as exc:
        raise ImportError("columnar batches need pyarrow: pip install 'kasper-py[arrow]'") from exc
    return pa


def to_arrow(messages: Sequence[Message], *,
             message_columns: Collection[str] = META_COLUMNS) -> Any:
    """The batch as an Arrow table: ``topic``, ``partition``, ``offset``, ``timestamp``
    (ms or null), ``key``, then the values. Values decoded to objects (``json``, Avro)
    give one column per field (a field missing from a record is null); undecoded JSON
    bytes (``value_serde="bytes"``) are parsed by Arrow's own JSON reader into the same
    columns, much faster than Python; any other value is one ``value`` column. A
    ``TableBatch`` (the Spark task's records, kept columnar) gives its own table.
    ``message_columns`` names the message's columns to build (in ``META_COLUMNS``'
    order whatever the order given): fewer, or none, cost less; the value's columns keep
    their names (``value.<name>`` for a field named like a message column) either way."""
    wanted = message_columns_of(message_columns)
    if isinstance(messages, TableBatch):
        return messages.table(wanted)
    if not messages:
        return import_pyarrow().table({name: [] for name in wanted})
    # one C-level pass per column (map over an itemgetter), none per message in Python
    return arrow_table({name: list(map(_FIELDS[name], messages))
                        for name in (*wanted, "value")}, wanted)


def message_columns_of(names: Collection[str]) -> tuple[str, ...]:
    """``names``, message columns, in ``META_COLUMNS``' order; a ``ValueError`` naming
    any other name (a ``str`` is refused whole: its letters are not column names)."""
    unknown = [names] if isinstance(names, str) else sorted(set(names) - set(META_COLUMNS))
    if unknown:
        raise ValueError(f"message_columns: {', '.join(map(repr, unknown))} is not a message "
                         f"column (one of {', '.join(META_COLUMNS)})")
    return tuple(name for name in META_COLUMNS if name in names)


def arrow_table(columns: Mapping[str, Any],
                message_columns: Collection[str] = META_COLUMNS) -> Any:
    """The table ``to_arrow`` makes, from a batch's columns (those of ``message_columns``
    and ``value``, non-empty, of equal lengths: lists, or Arrow arrays of the records
    already; ``value`` may be its columns already, a table from ``json_values``): the one
    place both runners build it, the loop from its messages and the Spark task from its
    Arrow records."""
    pa = import_pyarrow()
    values = columns["value"]
    if isinstance(values, list):
        values = _values(pa, values)
    names = [name if name not in META_COLUMNS else f"value.{name}"
             for name in values.column_names]
    wanted = message_columns_of(message_columns)
    if not wanted:
        return values if names == values.column_names else values.rename_columns(names)
    arrays = [_META_ARRAYS[name](pa, columns[name]) for name in wanted]
    return pa.Table.from_arrays([*arrays, *values.columns], names=[*wanted, *names])


class TableBatch(Sequence[Message]):
    """One partition's batch kept as columns (the Spark task's Arrow records): ``to_arrow``
    builds its table from them with no ``Message`` per record. Read as a sequence (a
    processor that iterates, a timestamp extractor, a replay skipped in part) it builds
    its messages once, from ``messages``."""

    def __init__(self, columns: dict[str, Any], messages: Callable[[], list[Message]]) -> None:
        self._columns = columns
        self._build = messages
        self._built: list[Message] | None = None

    def table(self, message_columns: Collection[str] = META_COLUMNS) -> Any:
        """The batch as ``to_arrow`` gives it (built again on each call)."""
        return arrow_table(self._columns, message_columns)

    def newest_timestamp(self) -> int | None:
        """The newest Kafka timestamp of the batch (``None`` when none has one)."""
        stamps = self._columns["timestamp"]
        if not isinstance(stamps, list):  # an Arrow column: its max skips the nulls
            newest: int | None = importlib.import_module("pyarrow.compute").max(stamps).as_py()
            return newest
        try:
            return max(stamps, default=None)
        except TypeError:  # some records have no timestamp
            return max((stamp for stamp in stamps if stamp is not None), default=None)

    def messages(self) -> list[Message]:
        """The batch as messages, built on first use."""
        if self._built is None:
            self._built = self._build()
        return self._built

    def __len__(self) -> int:
        return len(self._columns["offset"])

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self.messages()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())


_FIELDS = {name: operator.itemgetter(index) for index, name in enumerate(
    ("topic", "partition", "offset", "key", "value", "timestamp"))}
"""A ``Message``'s fields that ``arrow_table`` takes, by column name."""


def _constant_or(pa: Any, column: Any, kind: Any) -> Any:
    """``column`` as an array: one repeated scalar when every row holds the first's
    value (a partition's batch of one topic), counted in C; an Arrow column is cast."""
    if not isinstance(column, list):
        return column.cast(kind)
    if column.count(column[0]) == len(column):
        return pa.repeat(pa.scalar(column[0], kind), len(column))
    return pa.array(column, kind)


def _integers(pa: Any, column: Any) -> Any:
    """``column`` as an int64 array (a list converted, an Arrow column cast)."""
    return pa.array(column, pa.int64()) if isinstance(column, list) else column.cast(pa.int64())


def _keys(pa: Any, column: Any) -> Any:
    """The keys as an array (its type inferred from a list's keys): a null array when no
    message has one, counted in C."""
    absent = column.count(None) if isinstance(column, list) else column.null_count
    if absent == len(column):
        return pa.nulls(len(column))
    return pa.array(column) if isinstance(column, list) else column


_META_ARRAYS: dict[str, Callable[[Any, Any], Any]] = {
    "topic": lambda pa, column: _constant_or(pa, column, pa.string()),
    "partition": lambda pa, column: _constant_or(pa, column, pa.int64()),
    "offset": _integers,
    "timestamp": _integers,
    "key": _keys,
}
"""How each message column becomes an array, by name."""


def _values(pa: Any, values: list[Any]) -> Any:
    """The values' columns (a table of as many rows)."""
    if isinstance(values[0], dict) and all(map(isinstance, values, repeat(dict))):
        # every row's fields, as Arrow's JSON reader gives (from_pylist takes the first's)
        return pa.Table.from_struct_array(pa.array(values))
    table = json_values(values)
    return table if table is not None else pa.table({"value": values})


def json_values(values: list[Any], *, as_json_serde: bool = False) -> Any:
    """The values' columns from Arrow's JSON reader (one call for the batch), when every
    value is the bytes of one JSON object on one line; ``None`` otherwise. With
    ``as_json_serde``, also ``None`` (never an error) unless the table is certainly the one
    ``to_arrow`` builds from the same values decoded by the ``json`` serde: UTF-8 text, no
    integer of 19 digits or more (the reader makes a double of one beyond int64), no
    date-like string (the reader makes it a timestamp, the serde leaves it text)."""
    lines = _json_lines(values)
    if lines is None or (as_json_serde and not _decodes_alike(lines)):
        return None
    pa = import_pyarrow()
    try:
        table = pa.json.read_json(pa.py_buffer(lines),
                                  read_options=pa.json.ReadOptions(use_threads=False))
    except pa.ArrowInvalid:
        if as_json_serde:
            return None  # the serde's own error, or its skip policy, comes from its decoder
        raise
    if table.num_rows != len(values) or (as_json_serde and _has_timestamp(pa, table.schema)):
        return None  # two objects in one value; a date-like string
    return table


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
"""A run of 19 digits once every digit is ``0`` (``_DIGITS_AS_ZERO``): one C pass to
translate and one to find, ten times cheaper than a regular expression's search."""


def _decodes_alike(lines: bytes) -> bool:
    """Whether the ``json`` serde's decoder and Arrow's reader see the same text and
    numbers in ``lines``: valid UTF-8 (the serde refuses other bytes) and no run of 19
    digits (maybe an integer beyond int64, which the reader makes a double)."""
    try:
        lines.decode()
    except UnicodeDecodeError:
        return False
    return _LONG_NUMBER not in lines.translate(_DIGITS_AS_ZERO)


def _has_timestamp(pa: Any, kind: Any) -> bool:
    """Whether a timestamp type is in ``kind`` (a schema, struct or list type), at any depth."""
    if isinstance(kind, pa.Schema):
        return any(_has_timestamp(pa, field.type) for field in kind)
    if pa.types.is_timestamp(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_timestamp(pa, field.type) for field in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_timestamp(pa, kind.value_type)
    return False


def _json_lines(values: list[Any]) -> bytes | None:
    """The values as newline-delimited JSON, one line per value, when every value is
    the bytes of one JSON object on one line (Arrow's reader then gives a row each);
    ``None`` otherwise. Checked by counting in C, not by a Python step per value."""
    if not isinstance(values[0], bytes):
        return None
    try:
        lines = b"\n".join(values)
    except TypeError:  # not all bytes (None, str, ...)
        return None
    rows = len(values) - 1
    if lines[:1] != b"{" or lines.count(b"\n") != rows or lines.count(b"\n{") != rows:
        return None
    return lines


def send_table(sender: Sender, topic: str, table: Any, *, key: str | None = None,
               value: Sequence[str] | None = None) -> None:
    """Send one message to ``topic`` per row of ``table`` (an Arrow table, or anything
    with ``to_arrow()``: a Polars frame): its ``key`` column as the key (none when
    ``None``), the ``value`` columns (default: every other) as a dict value, which the
    topic's value serde encodes (``json``, Avro): a declared output topic's own
    (``OutputTopic.value_serde``, so a processor reading bytes sends JSON), else
    ``Config.value_serde``. Rows keep the table's order. For the ``json`` serde, columns
    of integers, booleans and plain ASCII text (no quote, backslash or control character)
    are encoded by Arrow, the bytes the serde would give."""
    if hasattr(table, "to_arrow"):
        table = table.to_arrow()
    columns = list(value) if value is not None else [
        name for name in table.column_names if name != key]
    rows = None
    if sender.value_serde(topic) is JSON:
        rows = _json_rows(table, columns)
    if rows is None:
        rows = table.select(columns).to_pylist()
    keys = table.column(key).to_pylist() if key is not None else [None] * len(rows)
    sender.send_many(topic, [(k, row, None, None) for k, row in zip(keys, rows, strict=True)])


_json_string = json.encoder.encode_basestring_ascii

_PLAIN_TEXT = r"^[ !#-\[\]-~]*$"
r"""Text the json serde writes as is between quotes: printable ASCII, no ``"`` nor ``\``."""


def _json_rows(table: Any, columns: Sequence[str]) -> list[bytes] | None:
    """Each row of ``columns`` as the ``json`` serde encodes its dict (compact, keys in
    order), joined by Arrow; ``None`` when a column is of another kind, whose text only
    Python's encoder gives exactly (floats, nested values, other text)."""
    pa = import_pyarrow()
    compute = importlib.import_module("pyarrow.compute")
    parts: list[Any] = []
    for index, name in enumerate(columns):
        column = table.column(name)
        kind = column.type
        if pa.types.is_integer(kind):
            text = column.cast(pa.string())
        elif pa.types.is_boolean(kind):
            text = compute.if_else(column, "true", "false")
        elif pa.types.is_string(kind) and compute.all(
                compute.match_substring_regex(column, _PLAIN_TEXT)).as_py() is not False:
            text = compute.binary_join_element_wise('"', column, '"', "")
        else:
            return None
        if column.null_count:
            text = compute.fill_null(text, "null")
        parts += [("{" if index == 0 else ",") + _json_string(name) + ":", text]
    if not parts:
        return None
    joined = compute.binary_join_element_wise(*parts, "}", "")
    return list(joined.cast(pa.binary()).to_pylist())


class ArrowMessageProcessor(MessageProcessor):
    """A processor of whole columns: ``process_table(table, sender)`` receives the
    partition's batch as ``to_arrow`` makes it, and sends with ``send_table``. The turn
    around it is the loop's own (and the Spark task's, whose records already come as
    Arrow batches), so its guarantees are every processor's."""

    message_columns: ClassVar[Collection[str]] = META_COLUMNS
    """The message's columns the table has (``to_arrow``'s ``message_columns``): all by
    default; a processor that reads only the values' columns names none (``()``), and
    its batches skip building them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        message_columns_of(cls.message_columns)  # a misspelt name fails where it is declared

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.process_table(to_arrow(messages, message_columns=self.message_columns), sender)

    @abstractmethod
    def process_table(self, table: Any, sender: Sender) -> None:
        """Handle one batch of one partition, as a table (see ``to_arrow``)."""
