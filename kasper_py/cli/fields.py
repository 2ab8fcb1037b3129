"""The ``Config`` schema as the command line reads it, derived from the dataclass fields
and their annotations, so a new field needs no second declaration: whether it is a
number, a list, a table of librdkafka settings or may be cleared, and its ``Literal``
choices. Parsing text (a flag or a ``KASPER_*`` variable) into a field's value lives
here; which fields are flags, and their help, in ``base``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from kasper_py.config import Config
from kasper_py.message import Message

__all__ = ["FIELDS", "FieldKind", "parse_flag", "parse_variable"]


@dataclass(frozen=True)
class FieldKind:
    """What text a ``Config`` field takes: a scalar of ``item`` (``int``, ``float`` or
    ``str``), or a comma-separated list of them; ``nullable``: ``""``/``none`` in a
    variable clears it; ``table``: a mapping (``*_overrides``), never read from one
    string; ``choices``: its ``Literal`` values."""

    name: str
    item: type
    is_list: bool = False
    nullable: bool = False
    table: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False


def _kind(field: dataclasses.Field[Any], hint: Any) -> FieldKind:
    required = (field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING)
    nullable = False
    if get_origin(hint) in (Union, types.UnionType):
        members = get_args(hint)
        nullable = type(None) in members
        kept = [m for m in members if m is not type(None)]
        hint = kept[0] if len(kept) == 1 or str not in kept else str
    origin = get_origin(hint)
    if origin is Literal:
        return FieldKind(field.name, str, nullable=nullable, required=required,
                         choices=tuple(str(c) for c in get_args(hint)))
    if origin is not None and issubclass(origin, Mapping):
        return FieldKind(field.name, str, table=True, required=required)
    if origin is not None and issubclass(origin, Sequence):
        item = get_args(hint)[0]
        return FieldKind(field.name, item if item in (int, float) else str, is_list=True,
                         nullable=nullable, required=required)
    return FieldKind(field.name, hint if hint in (int, float) else str,
                     nullable=nullable, required=required)


def _fields() -> dict[str, FieldKind]:
    # Message is imported under TYPE_CHECKING in config.py: name it for the evaluation
    hints = get_type_hints(Config, localns={"Message": Message})
    return {f.name: _kind(f, hints[f.name]) for f in dataclasses.fields(Config)}


FIELDS: dict[str, FieldKind] = _fields()
"""Every ``Config`` field's kind, in declaration order."""


def _split(text: str, item: Callable[[str], Any]) -> list[Any]:
    return [item(part.strip()) for part in text.split(",") if part.strip()]


def parse_flag(name: str) -> Callable[[str], Any]:
    """The argparse ``type`` of field ``name``'s flag: ``int``, ``float``, ``str``, or a
    parser of a comma-separated list."""
    kind = FIELDS[name]
    if not kind.is_list:
        if not kind.nullable or kind.item is str:
            return kind.item

        def or_none(text: str) -> Any:
            """A number, or ``"none"`` kept as text (a flag's ``None`` means not given;
            ``load_config`` clears the field for it)."""
            return "none" if text.strip().lower() in ("", "none") else kind.item(text)

        or_none.__name__ = kind.item.__name__
        return or_none

    def comma_list(text: str) -> list[Any]:
        return _split(text, kind.item)

    comma_list.__name__ = f"{kind.item.__name__} list"
    return comma_list


def parse_variable(name: str, raw: str) -> Any:
    """Field ``name``'s value from a variable's text, stripped: ``None`` for ``""`` or
    ``none`` when it may be cleared. Raises ``ValueError`` when a number does not parse."""
    kind, text = FIELDS[name], raw.strip()
    if kind.nullable and text.lower() in ("", "none"):
        return None
    if kind.is_list:
        return _split(text, kind.item)
    return kind.item(text)
