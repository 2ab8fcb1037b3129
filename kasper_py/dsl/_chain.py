"""Stateless operators fused into one pass: a run of ``filter``, ``map``, ``map_values``,
``flat_map``... (and the ``to`` or repartition that may end it) is one ``Chain``, one
list comprehension over the batch's records compiled once per stage from the steps'
code, so a record costs the user's functions and no list, tuple or call per step in
between.

Only fixed templates and step numbers go into the compiled source; the user's
functions are values of its namespace, never text. A sink's records go to the
``Sender`` in one call per batch, not one a record: a chain reading a topic's messages
and ending in ``to`` makes the producer's records themselves, each key and value that
is not bytes encoded in place by the topic's serde (``Sender.encoders``,
``send_encoded``) and a message's headers, when it has any, converted as ``send`` does
(``producer_headers``): no record of its own, no second loop, no pass over the batch
to check types or look for headers; other sinks go through ``send_many``. Each clause of
the comprehension is a line of its own, so a step that raises is found from the
traceback's line, and the error is noted with the operator's name and the record's
topic, partition and offset (``where``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, Literal

from kasper_py.dsl._ops import Op, Records, StageContext
from kasper_py.exceptions import SerdeError
from kasper_py.message import Message
from kasper_py.sender import producer_headers

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


Form = Literal["records", "messages", "send"]
"""What a compiled chain reads and makes: ``records`` (key, value, timestamp, headers)
into records; ``messages``: ``Message``s into records; ``send``: ``Message``s into the
producer's records for ``topic`` (``OutgoingRecord``: headers only when the message
has some), a record without a timestamp taking ``inherited``."""

_UNPACK = {"records": "k, v, t, h", "messages": "tp, pa, o, k, v, t, h, _",
           "send": "tp, pa, o, k, v, t, h, _"}
"""A record's or a message's parts as the comprehension names them (a message's topic,
partition and offset too: ``where`` reads them from the failed frame)."""
_MADE, _FIRST_CLAUSE = 2, 4
"""The lines of the compiled source (``_code``) making a record and of the first
step's clause."""


def compile_chain(steps: Sequence[Step], *, form: Form = "records"
                  ) -> Callable[..., Records]:
    """``run(records)`` (``run(messages, topic, inherited, ek, ev, eh)`` for ``send``,
    the key, value and headers encoders of ``topic``): what the
    steps make of the batch, in order, from one list comprehension (the sink's records
    too: they go on in one call). ``messages`` and ``send`` read ``Message``s, taking
    their key, value, timestamp and headers as they are (no record built per message)."""
    kinds = tuple(step.kind for step in steps)
    namespace: dict[str, Any] = {}
    namespace.update((f"f{i}", step.function) for i, step in enumerate(steps))
    exec(_code(kinds, form), namespace)  # see the docstring
    run: Callable[..., Records] = namespace["run"]
    return run


@functools.cache
def _code(kinds: tuple[StepKind, ...], form: Form) -> CodeType:
    """The compiled comprehension of a chain of step ``kinds`` (once per shape), a
    clause a line from line ``_FIRST_CLAUSE`` on."""
    clauses, names = [f"for {_UNPACK[form]} in records"], {"k": "k", "v": "v"}
    for i, kind in enumerate(kinds):
        if kind == "pass":
            continue
        code, new_key, new_value = _CODE[kind]
        clauses.append(code.format(i=i, **names))
        names = {"k": f"k{i}" if new_key else names["k"],
                 "v": f"v{i}" if new_value else names["v"]}
    body = "\n        ".join(clauses)
    if form == "send":  # OutgoingRecord's positions, encoded as send() does them
        key, value = names["k"], names["v"]
        record = (f"topic, {value} if type({value}) is bytes or {value} is None else "
                  f"ev({value}), {key} if type({key}) is bytes or {key} is None else "
                  f"ek({key}), -1, None, None, inherited if t is None else t")
        # one test of the headers a record, in the pass: none is the common case
        head, made = ("run(records, topic, inherited, ek, ev, eh)",
                      f"({record}) if not h else ({record}, eh(h))")
    else:
        head, made = "run(records)", f"({names['k']}, {names['v']}, t, h)"
    source = f"def {head}:\n    return [{made}\n        {body}]"
    title = " -> ".join(kind for kind in kinds if kind != "pass") or "pass"
    return compile(source, f"{_TITLE}{title}>", "exec")


_TITLE = "<dsl chain: "


def where(exc: BaseException, operators: Sequence[str]) -> str | None:
    """Where in a chain of steps named ``operators`` (the clauses' order) ``exc`` was
    raised: the operator, and the message's topic, partition and offset when the chain
    read messages; ``None`` when it was not raised by a step."""
    frame, line = _raised_in(exc)
    step = line - _FIRST_CLAUSE
    if frame is None or not 0 <= step < len(operators):
        return None
    found = frame.f_locals
    if "o" not in found:
        return f"in operator {operators[step]}"
    return (f"in operator {operators[step]}, on the record of topic {found['tp']!r} "
            f"partition {found['pa']} offset {found['o']}")


def _raised_in(exc: BaseException) -> tuple[FrameType | None, int]:
    """The innermost frame of a compiled chain ``exc`` went through, and its line."""
    frame, line = None, 0
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_TITLE):
            frame, line = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    return frame, line


class Chain(Op):
    """A run of stateless steps as one operator: one loop per batch; ``serial``: its
    records go on one at a time (its children's paths meet again: ``_graph``).
    ``operators``: the steps' names, for errors. ``push_messages``, for a source's
    messages, is chosen once: to a topic, the producer's records made in the pass
    (``send_messages``); else records made from the messages and handed on."""

    __slots__ = ("operators", "push_messages", "run", "run_messages", "run_send", "serial",
                 "sink", "stage")

    def __init__(self, stage: StageContext, steps: Sequence[Step], sink: Sink | None, *,
                 serial: bool = False, operators: Sequence[str] = ()) -> None:
        super().__init__()
        self.stage, self.sink, self.serial = stage, sink, serial
        self.operators = [*operators, *(f"#{i}" for i in range(len(operators), len(steps)))]
        self.run = compile_chain(steps)
        self.run_messages = compile_chain(steps, form="messages")
        self.run_send = compile_chain(steps, form="send") if self.to_topic else None
        self.push_messages: Callable[[list[Message]], None] = (
            self.send_messages if self.to_topic else self._push_messages)

    @property
    def to_topic(self) -> bool:
        """Whether the chain ends in ``to`` a topic (``send_messages`` serves it)."""
        return self.sink is not None and self.sink.kind == "topic"

    def push(self, records: Records) -> None:
        self._loop(self.run, records)

    def _push_messages(self, messages: list[Message]) -> None:
        self._loop(self.run_messages, messages)

    def send_messages(self, messages: list[Message]) -> None:
        """A source's ``messages`` through a chain ending in ``to``: the producer's
        records made in the one pass and buffered at once (``Sender.send_encoded``)."""
        assert self.sink is not None and self.run_send is not None
        sender, topic = self.stage.sender, self.sink.target
        try:
            made = self.run_send(messages, topic, sender.timestamp or 0,
                                 *sender.encoders(topic), producer_headers)
        except SerdeError as exc:
            if _raised_in(exc)[1] == _MADE:  # the topic's serde refused a key or value
                raise sender.refused(topic, exc) from exc
            self._noted(exc)
            raise
        except Exception as exc:
            self._noted(exc)
            raise
        sender.send_encoded(topic, made)

    def _loop(self, run: Callable[[Any], Records], records: Any) -> None:
        try:
            out = run(records)
        except Exception as exc:
            self._noted(exc)
            raise
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

    def _noted(self, exc: Exception) -> None:
        """Note on ``exc`` which step raised it, on which record."""
        note = where(exc, self.operators)
        if note is not None:
            exc.add_note(note)


class Branch(Op):
    """Each record goes to the first branch whose predicate holds (or none), routed by
    one compiled loop over the batch (``_route_code``): no loop over the predicates per
    record. ``operator``: the branch's name, for errors."""

    __slots__ = ("operator", "route")

    def __init__(self, predicates: Sequence[Callable[[Any, Any], bool]],
                 operator: str = "branch") -> None:
        super().__init__()
        self.operator = operator
        namespace: dict[str, Any] = {f"p{i}": p for i, p in enumerate(predicates)}
        exec(_route_code(len(predicates)), namespace)  # fixed text, as _code's
        self.route: Callable[[Records], tuple[Records, ...]] = namespace["route"]

    def push(self, records: Records) -> None:
        try:
            buckets = self.route(records)
        except Exception as exc:
            exc.add_note(f"in operator {self.operator}")
            raise
        for child, bucket in zip(self.children, buckets, strict=True):
            if bucket:
                child.push(bucket)


@functools.cache
def _route_code(branches: int) -> CodeType:
    """``route(records)``: the records of each of ``branches`` branches (predicates
    ``p0``, ``p1``...), in order, each record in the first whose predicate holds."""
    if not branches:
        return compile("def route(records):\n    return ()", "<dsl branch of 0>", "exec")
    names = range(branches)
    tests = "".join(f"\n        {'if' if i == 0 else 'elif'} p{i}(k, v):\n            a{i}(r)"
                    for i in names)
    source = (f"def route(records):\n    buckets = ({''.join('[], ' for _ in names)})\n"
              f"    {''.join(f'a{i}, ' for i in names)}= (b.append for b in buckets)\n"
              f"    for r in records:\n        k, v, _, _ = r{tests}\n    return buckets")
    return compile(source, f"<dsl branch of {branches}>", "exec")
