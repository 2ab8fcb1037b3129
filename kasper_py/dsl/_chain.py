"""Stateless operators fused into one pass: a run of ``filter``, ``map``, ``map_values``,
``flat_map``... (and the ``to`` or repartition that may end it) is one ``Chain``, one
list comprehension over the batch's records compiled once per stage from the steps'
code, so a record costs the user's functions and no list, tuple or call per step in
between.

Only fixed templates and step numbers go into the compiled source; the user's
functions are values of its namespace, never text. A sink's records go to the
``Sender`` in one call per batch (``send_many``), not one a record.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, Literal

from kasper_py.dsl._ops import Op, Records, StageContext
from kasper_py.message import Message

StepKind = Literal["pass", "filter", "filter_not", "map", "map_values", "select_key",
                   "flat_map", "flat_map_values", "peek"]
SinkKind = Literal["topic", "repartition"]

_CODE: dict[str, tuple[str, bool, bool]] = {
    "filter": ("if f{i}({k}, {v})", False, False),
    "filter_not": ("if not f{i}({k}, {v})", False, False),
    "map": ("for k{i}, v{i} in [f{i}({k}, {v})]", True, True),
    "map_values": ("for v{i} in [f{i}({v})]", False, True),
    "select_key": ("for k{i} in [f{i}({k}, {v})]", True, False),
    "flat_map": ("for k{i}, v{i} in f{i}({k}, {v})", True, True),
    "flat_map_values": ("for v{i} in f{i}({v})", False, True),
    "peek": ("for _ in [f{i}({k}, {v})]", False, False),
}
"""Each step's clause of the chain's list comprehension, on the record's key and value
(``{k}``, ``{v}``: the names the steps before gave them; ``t`` timestamp, ``h``
headers), and whether it names a new key and value (``k{i}``, ``v{i}``: a name per
step, so nothing a step binds in a ``flat_map``'s loop leaks into the next record's).
``for x in [call]`` is an assignment (CPython compiles it to one since 3.9)."""


@dataclass(frozen=True)
class Step:
    """One stateless operator as declared: its kind and the user's function."""

    kind: StepKind
    function: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Sink:
    """Where a chain ending in ``to`` or a repartition sends its records."""

    kind: SinkKind
    target: str


def compile_chain(steps: Sequence[Step], *, messages: bool = False
                  ) -> Callable[[Any], Records]:
    """``run(records)``: the records ``(key, value, timestamp, headers)`` the steps make
    of ``records``, in order, from one list comprehension (the sink's records too: they
    go on in one call). With ``messages`` it reads ``Message``s, taking their key,
    value, timestamp and headers as they are (no record built per message)."""
    kinds = tuple(step.kind for step in steps)
    namespace: dict[str, Any] = {}
    namespace.update((f"f{i}", step.function) for i, step in enumerate(steps))
    exec(_code(kinds, messages), namespace)  # see the docstring
    run: Callable[[Any], Records] = namespace["run"]
    return run


@functools.cache
def _code(kinds: tuple[StepKind, ...], messages: bool) -> CodeType:
    """The compiled comprehension of a chain of step ``kinds`` (once per shape)."""
    unpack = "_, _, _, k, v, t, h, _" if messages else "k, v, t, h"
    clauses, names = [f"for {unpack} in records"], {"k": "k", "v": "v"}
    for i, kind in enumerate(kinds):
        if kind == "pass":
            continue
        code, new_key, new_value = _CODE[kind]
        clauses.append(code.format(i=i, **names))
        names = {"k": f"k{i}" if new_key else names["k"],
                 "v": f"v{i}" if new_value else names["v"]}
    body = "\n        ".join(clauses)
    source = f"def run(records):\n    return [({names['k']}, {names['v']}, t, h)\n        {body}]"
    title = " -> ".join(kind for kind in kinds if kind != "pass") or "pass"
    return compile(source, f"<dsl chain: {title}>", "exec")


class Chain(Op):
    """A run of stateless steps as one operator: one loop per batch; ``serial``: its
    records go on one at a time (its children's paths meet again: ``_graph``)."""

    __slots__ = ("run", "run_messages", "serial", "sink", "stage")

    def __init__(self, stage: StageContext, steps: Sequence[Step], sink: Sink | None, *,
                 serial: bool = False) -> None:
        super().__init__()
        self.stage, self.sink, self.serial = stage, sink, serial
        self.run = compile_chain(steps)
        self.run_messages = compile_chain(steps, messages=True)

    def push(self, records: Records) -> None:
        self._loop(self.run, records)

    def push_messages(self, messages: list[Message]) -> None:
        """``push`` for a source's messages, the chain's first operator reading them."""
        self._loop(self.run_messages, messages)

    def _loop(self, run: Callable[[Any], Records], records: Any) -> None:
        out = run(records)
        sink = self.sink
        if sink is None:
            if self.serial:
                for record in out:
                    self.emit([record])
            else:
                self.emit(out)
        elif not out:
            return
        elif sink.kind == "topic":  # the batch's records, one call, in order
            self.stage.sender.send_many(sink.target, out)
        else:  # a record with a None key has no partition to go to: skipped, counted
            self.stage.repartition(sink.target, self.stage.skips.kept(out, value=False))
