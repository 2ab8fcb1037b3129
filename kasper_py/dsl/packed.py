"""The frame of a packed repartition record, public for readers of a DSL app's
repartition topics other than the app, and for tests (``unpack``, ``unpacked``).

A DSL stage writes a turn's records for one repartition as one Kafka record per
destination partition (several when a partition's share is larger than ``FRAME_CAP``),
and the stage reading it expands each back into its records, in order (``_packing``).
A packed record's key is ``PACKED_KEY``, bytes that no serde but ``bytes`` decodes, so a
kasper_py older than packing fails on it instead of skipping it as a record with no key
(docs/streams-dsl.md); its value is null and its first header, ``kasper.packed``, holds
the frame. The loop's decoder passes such a record on undecoded, as one with no key and
no value (what packed records were at first, still read), and its batching, offsets and
commits see it as any other record. The frame, column by column (so both sides pack
and unpack a column in one C call)::

    version     u8: 1, or 2 when flags is 2
    count       u32: n records
    flags       u8: 1 when a headers section ends the frame; 2 when a headers column
                does (version 2)
    timestamps  n x i64 (0: the outer record's)
    key sizes   n x i32 (-1: None)
    value sizes n x i32 (-1: None)
    keys        the keys' bytes, one after another
    values      the values' bytes, one after another
    headers     (flag 1) per record: u16 count; per header: u16 name size, i32 value
                size (-1: None), the name (UTF-8), the value
                (flag 2) every record has one header, all of one name, with a value (a
                combined record's partial count): u16 name size, the name, n x i32
                value sizes, the values, one after another

every number little-endian. A frame is version 2 only when it holds a headers column, so
frames without one stay readable by a kasper_py that reads version 1 alone; one that
holds one fails there, loudly (an unknown version).
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, itemgetter

from kasper_py.message import PACKED, PACKED_KEY, Headers, OutgoingMessage

__all__ = ["FRAME_CAP", "PACKED", "PACKED_KEY", "VERSION", "Columns", "frames", "unpack",
           "unpacked"]

VERSION = 2
"""The newest frame version this kasper_py writes and reads (it reads 1 too)."""
FRAME_CAP = 256 * 1024
"""Bytes a frame holds at most (a record larger alone gets a frame of its own): a
quarter of Kafka's default ``max.message.bytes`` (1 MiB), so a frame never nears it."""
_HEAD = struct.Struct("<BIB")
_HEADER = struct.Struct("<Hi")
_PER_RECORD = 16
"""Bytes of a record's timestamp and sizes."""
_SWAP = sys.byteorder == "big"

Inner = tuple["bytes | None", "bytes | None", int, "Sequence[tuple[str, bytes | None]] | None"]
"""A record to pack: key bytes, value bytes, timestamp (0: the outer's), headers."""
Columns = tuple[list["bytes | None"], list["bytes | None"], list[int], "list[Headers] | None"]
"""A frame's records as columns: keys, values, timestamps, and headers (``None``: no
record has any)."""


def frames(records: Sequence[Inner], cap: int = FRAME_CAP) -> list[bytes]:
    """``records`` as frames of at most ``cap`` bytes each (one record larger than
    ``cap`` gets a frame alone), in order; none for no records."""
    keys, values, stamps = [r[0] for r in records], [r[1] for r in records], [
        r[2] for r in records]
    headers = [r[3] for r in records] if any(r[3] for r in records) else None
    return columns_frames(keys, values, stamps, headers, cap)


def columns_frames(keys: Sequence[bytes | None], values: Sequence[bytes | None],
                   stamps: Sequence[int],
                   headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None,
                   cap: int = FRAME_CAP) -> list[bytes]:
    """``frames`` of records given as columns (``headers``: ``None`` when none has any)."""
    if not keys:
        return []
    packing = _Packing(keys, values, stamps, *_sizes(keys), *_sizes(values),
                       *((None, None) if headers is None else _headers_column(headers)))
    size, room = packing.size(), cap - packing.head()
    if size <= cap:
        return [packing.frame()]
    step = max(1, room // packing.largest())  # records that surely fit
    if len(keys) / step <= 2 * size / cap:  # about as few frames as can be: cut by count
        return [packing.cut(start, start + step).frame() for start in range(0, len(keys), step)]
    ends = packing.ends()  # sizes differ widely: the most records that fit, at least one
    found, start, before = [], 0, 0
    while start < len(keys):
        stop = max(bisect_right(ends, before + room), start + 1)
        found.append(packing.cut(start, stop).frame())
        start, before = stop, ends[stop - 1]
    return found


@dataclass
class _Packing:
    """Records to pack, as columns, with their keys' and values' sizes (-1: None) and
    whether some is None, and their headers encoded (``None``: no record has any), or,
    with ``header_name``, the values of each record's one header of that name (a
    headers column, version 2)."""

    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    stamps: Sequence[int]
    key_sizes: list[int]
    keys_missing: bool
    value_sizes: list[int]
    values_missing: bool
    headers: list[bytes] | None
    header_name: bytes | None

    def head(self) -> int:
        """The bytes of the frame's head: its first numbers, and a headers column's name."""
        return _HEAD.size + (0 if self.header_name is None else 2 + len(self.header_name))

    def per_record(self) -> int:
        """The bytes of a record's numbers: timestamp, sizes, a header value's size."""
        return _PER_RECORD + (0 if self.header_name is None else 4)

    def ends(self) -> list[int]:
        """Where each record would end in one frame, counted from the end of its head."""
        sizes = map(add, map(max, self.key_sizes, repeat(0)), map(max, self.value_sizes,
                                                                   repeat(0)))
        if self.headers is not None:
            sizes = map(add, sizes, map(len, self.headers))
        return list(accumulate(map(add, sizes, repeat(self.per_record()))))

    def largest(self) -> int:
        """The bytes of the largest record, at most."""
        key, value = max(self.key_sizes), max(self.value_sizes)  # -1: None
        return (self.per_record() + max(key, 0) + max(value, 0)
                + (0 if self.headers is None else max(map(len, self.headers))))

    def size(self) -> int:
        """The frame's bytes."""
        return (self.head() + self.per_record() * len(self.keys)  # a None's size is -1
                + sum(self.key_sizes) + (self.key_sizes.count(-1) if self.keys_missing else 0)
                + sum(self.value_sizes)
                + (self.value_sizes.count(-1) if self.values_missing else 0)
                + (0 if self.headers is None else sum(map(len, self.headers))))

    def cut(self, start: int, stop: int) -> _Packing:
        return _Packing(self.keys[start:stop], self.values[start:stop],
                        self.stamps[start:stop], self.key_sizes[start:stop], self.keys_missing,
                        self.value_sizes[start:stop], self.values_missing,
                        None if self.headers is None else self.headers[start:stop],
                        self.header_name)

    def frame(self) -> bytes:
        numbers = [array("q", self.stamps), array("i", self.key_sizes),
                   array("i", self.value_sizes)]
        if _SWAP:
            numbers = [_swapped(column) for column in numbers]
        return b"".join([self._head(), *(column.tobytes() for column in numbers),
                         b"".join(filter(None, self.keys) if self.keys_missing
                                  else self.keys),  # type: ignore[arg-type]  # no None
                         b"".join(filter(None, self.values) if self.values_missing
                                  else self.values),  # type: ignore[arg-type]  # no None
                         *self._headers_section()])

    def _head(self) -> bytes:
        if self.headers is None:
            return _HEAD.pack(1, len(self.keys), 0)
        return _HEAD.pack(1, len(self.keys), 1) if self.header_name is None else _HEAD.pack(
            2, len(self.keys), 2)

    def _headers_section(self) -> list[bytes]:
        if self.headers is None or self.header_name is None:
            return self.headers or []
        sizes = array("i", map(len, self.headers))
        if _SWAP:
            sizes = _swapped(sizes)
        return [len(self.header_name).to_bytes(2, "little"), self.header_name,
                sizes.tobytes(), *self.headers]


def _sizes(column: Sequence[bytes | None]) -> tuple[list[int], bool]:
    """The size of each item of ``column`` (-1: None), and whether some is None."""
    try:
        return list(map(len, column)), False  # type: ignore[arg-type]  # None raises
    except TypeError:
        return [-1 if item is None else len(item) for item in column], True


def _swapped(column: array[int]) -> array[int]:
    copy = array(column.typecode, column)
    copy.byteswap()
    return copy


def _headers_column(headers: Sequence[Sequence[tuple[str, bytes | None]] | None]
                    ) -> tuple[list[bytes], bytes | None]:
    """Each record's headers: when every record has one header, all of one name, none
    ``None`` (a combined record's partial count), the values and the name (a headers
    column, C loops); else each record's encoded, a record at a time, and ``None``."""
    try:
        ones = list(map(_FIRST, headers)) if set(map(len, headers)) == {1} else None  # type: ignore[arg-type]  # None raises
    except TypeError:  # a record has None for headers
        ones = None
    if ones is None or len(set(map(_FIRST, ones))) != 1:
        return list(map(_headers, headers)), None
    values = list(map(_SECOND, ones))
    if None in values or not set(map(type, values)) <= {bytes}:
        return list(map(_headers, headers)), None
    return values, ones[0][0].encode()


_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_SIZE = struct.Struct("<i")


def _headers(headers: Sequence[tuple[str, bytes | None]] | None) -> bytes:
    if not headers:
        return b"\x00\x00"
    parts = [len(headers).to_bytes(2, "little")]
    for name, value in headers:
        encoded = name.encode()
        parts.append(_HEADER.pack(len(encoded), -1 if value is None else len(value))
                     + encoded + (value or b""))
    return b"".join(parts)


def unpack(frame: bytes) -> list[tuple[bytes | None, bytes | None, int, Headers]]:
    """The records of ``frame``, in order: (key, value, timestamp, headers). Raises
    ``ValueError`` saying what is wrong with a frame that is not one (unknown version,
    truncated, trailing bytes)."""
    keys, values, stamps, headers = unpack_columns(frame)
    return list(zip(keys, values, stamps, repeat(()) if headers is None else headers,
                    strict=False))  # repeat() has no end


def unpack_columns(frame: bytes) -> Columns:
    """``unpack``, column by column."""
    if len(frame) < _HEAD.size:
        raise ValueError(f"a frame of {len(frame)} bytes is shorter than its head")
    version, count, flags = _HEAD.unpack_from(frame)
    if version not in {1, VERSION}:
        raise ValueError(f"frame version {version} is unknown (this kasper_py reads "
                         f"versions 1 to {VERSION}): written by a newer kasper_py?")
    at = _HEAD.size + _PER_RECORD * count
    if at > len(frame):
        raise ValueError(f"the frame ends inside the sizes of its {count} records")
    stamps, key_sizes, value_sizes = (
        struct.unpack_from(f"<{count}{typecode}", frame, start)
        for typecode, start in (("q", _HEAD.size), ("i", _HEAD.size + 8 * count),
                                ("i", _HEAD.size + 12 * count)))
    keys, at = _column(frame, at, key_sizes)
    values, at = _column(frame, at, value_sizes)
    headers = None
    if flags & 2:
        headers, at = _headers_of_column(frame, at, count)
    elif flags & 1:
        headers, at = _read_headers(frame, at, count)
    if at != len(frame):
        raise ValueError(f"the frame holds {len(frame) - at} bytes after its {count} records")
    return keys, values, list(stamps), headers


def _column(frame: bytes, at: int, sizes: tuple[int, ...]) -> tuple[list[bytes | None], int]:
    """The items of sizes ``sizes`` from ``at`` on, and where they end: cut by one
    ``struct`` layout of the column (one C call, not a slice a record)."""
    if not sizes:
        return [], at
    low, high = min(sizes), max(sizes)
    if high < 0:  # every item None (a combined record's value)
        return [None] * len(sizes), at
    missing = low < 0
    layout = (_layout(tuple(map(max, sizes, repeat(0))), 0, high) if missing
              else _layout(sizes, low, high))
    if at + layout.size > len(frame):
        raise ValueError(f"the frame ends inside its data ({at + layout.size} bytes of "
                         f"{len(frame)})")
    items: list[bytes | None] = list(layout.unpack_from(frame, at))
    if missing:
        items = [None if size < 0 else item for item, size in zip(items, sizes, strict=True)]
    return items, at + layout.size


_SIZE_FORMATS = tuple(f"{size}s" for size in range(256))
"""``struct``'s format of a bytes item of each size under 256 (a key or value most)."""


def _layout(sizes: tuple[int, ...], smallest: int, largest: int) -> struct.Struct:
    """The ``struct`` layout of consecutive bytes items of ``sizes``, none negative, from
    ``smallest`` to ``largest``."""
    if largest == smallest:
        return struct.Struct(f"<{f'{largest}s' * len(sizes)}")
    if largest < len(_SIZE_FORMATS):
        return struct.Struct("<" + "".join(map(_SIZE_FORMATS.__getitem__, sizes)))
    return struct.Struct("<" + "".join(map("%ds".__mod__, sizes)))


def _headers_of_column(frame: bytes, at: int, count: int) -> tuple[list[Headers], int]:
    """A version 2 frame's headers column from ``at`` on (one header a record, all of
    one name), and where it ends: its values cut by one ``struct`` layout."""
    try:
        (size,) = struct.unpack_from("<H", frame, at)
        name = frame[at + 2:at + 2 + size].decode(errors="replace")
        at += 2 + size
        sizes = struct.unpack_from(f"<{count}i", frame, at)
        values, at = _column(frame, at + 4 * count, sizes)
    except (struct.error, ValueError):
        raise ValueError("the frame ends inside the headers column") from None
    return list(zip(zip(repeat(name), values))), at  # ((name, value),) a record, in C


def _read_headers(frame: bytes, at: int, count: int) -> tuple[list[Headers], int]:
    one_each = _one_header_each(frame, at, count)
    if one_each is not None:
        return one_each
    found: list[Headers] = []
    try:
        for _ in range(count):
            (many,) = struct.unpack_from("<H", frame, at)
            at += 2
            headers = []
            for _ in range(many):
                name_size, value_size = _HEADER.unpack_from(frame, at)
                at += _HEADER.size
                name, value = frame[at:at + name_size], None
                at += name_size
                if value_size >= 0:
                    value = frame[at:at + value_size]
                    at += value_size
                if at > len(frame):
                    raise struct.error("truncated")
                headers.append((name.decode(errors="replace"), value))
            found.append(tuple(headers))
    except struct.error:
        raise ValueError(f"the frame ends inside the headers of record {len(found)}") from None
    return found, at


def _one_header_each(frame: bytes, at: int, count: int) -> tuple[list[Headers], int] | None:
    """``_read_headers`` when every record has one header, all of the first's name, with
    a value (a combined record's partial count): less work a record; ``None`` when some
    record is otherwise, or the frame ends early (the general reading says where)."""
    if at + _ONE.size > len(frame):
        return None
    many, name_size, _ = _ONE.unpack_from(frame, at)
    head, name = frame[at:at + 4], frame[at + _ONE.size:at + _ONE.size + name_size]
    if many != 1 or len(name) != name_size:
        return None
    found: list[Headers] = []
    text, skip = name.decode(errors="replace"), _ONE.size + name_size
    size_at, append = _SIZE.unpack_from, found.append
    for _ in range(count):
        if not (frame.startswith(head, at) and frame.startswith(name, at + _ONE.size)):
            return None
        (size,) = size_at(frame, at + 4)
        start = at + skip
        at = start + size
        if size < 0 or at > len(frame):
            return None
        append(((text, frame[start:at]),))
    return found, at


_ONE = struct.Struct("<HHi")
"""A record's headers section with one header: count, name size, value size."""


def unpacked(messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
    """``messages`` (what a ``ProcessorDriver`` sent, say) with each packed one replaced
    by the messages it holds, as they would have been sent plain (partitioned by key;
    a timestamp of 0 inherits the packed record's)."""
    found: list[OutgoingMessage] = []
    for message in messages:
        headers = message.headers
        if not headers or headers[0][0] != PACKED:
            found.append(message)
            continue
        found += [OutgoingMessage(message.topic, value, key, None, inner or None,
                                  timestamp or message.timestamp)
                  for key, value, timestamp, inner in unpack(headers[0][1] or b"")]
    return found
