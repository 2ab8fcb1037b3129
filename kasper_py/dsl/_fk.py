"""The foreign-key table join (Kafka Streams' KIP-213), in three operators over two
repartitions of the app:

1. ``Subscribe`` (the left table's stage): a left update ``(lk, lv)`` subscribes ``lk``
   to ``fk = foreign_key(lv)`` through the subscription repartition, keyed by ``fk``
   (and unsubscribes it from its previous foreign key), with a hash of ``lv``;
2. ``Answer`` (the right table's stage): keeps ``fk -> {lk: hash}``; a subscription is
   answered with the right value of ``fk``, and a right update ``(fk, rv)`` is sent to
   every subscriber, through the response repartition keyed by ``lk``;
3. ``Result`` (the left stage again): an answer whose hash no longer matches the left
   value is stale (the left row changed since) and dropped; otherwise the joined value
   is stored and emitted. A left delete, or a left row without a foreign key, is
   answered at once, with no round trip.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from kasper_py.dsl._ops import CachedTable, Op, Records, StageContext, TableOp
from kasper_py.dsl._times import Times
from kasper_py.sender import SendRecord
from kasper_py.stores.base import KeyValueStore


def digest(value: Any) -> str:
    """A stable hash of a left value (the same in every process)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _wire(payload: dict[str, Any]) -> bytes:
    """A repartition value as bytes: the sender passes bytes through, whatever the
    config's value serde, so the other side reads it back with ``_unwire``."""
    return json.dumps(payload, separators=(",", ":")).encode()


def _unwire(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value  # the config's serde is JSON: decoded already
    text = value.decode() if isinstance(value, bytes) else value
    found = json.loads(text)
    assert isinstance(found, dict)
    return found


class Subscribe(Op):
    """The left side: subscriptions out, immediate answers to ``Result`` (its child)."""

    __slots__ = ("foreign_key", "joiner", "left", "name", "stage", "state")

    def __init__(self, stage: StageContext, state: KeyValueStore, name: str,
                 foreign_key: Callable[[Any], Any], joiner: Callable[[Any, Any], Any], *,
                 left: bool) -> None:
        super().__init__()
        self.stage, self.state, self.name = stage, state, name
        self.foreign_key, self.joiner, self.left = foreign_key, joiner, left

    def push(self, records: Records) -> None:
        before = self.state.get_many({r[0] for r in records})
        now: dict[Any, Any] = {}
        answered: Records = []
        requests: list[SendRecord] = []
        for lk, lv, timestamp, headers in records:
            fk = None if lv is None else self.foreign_key(lv)
            old = now[lk] if lk in now else before.get(lk)
            if old is not None and old != fk:
                requests.append((old, _wire({"lk": lk, "op": "unsub"}), timestamp, None))
            now[lk] = fk
            if fk is not None:
                requests.append((fk, _wire({"lk": lk, "op": "sub", "h": digest(lv)}),
                                 timestamp, None))
            elif lv is None or not self.left:
                answered.append((lk, None, timestamp, headers))
            else:
                answered.append((lk, self.joiner(lv, None), timestamp, headers))
        _send(self.stage, self.name, requests)
        self.state.put_many(now)
        self.emit(answered)


class Answer(Op):
    """The right side: ``side(0)`` takes subscriptions, ``side(1)`` right updates."""

    __slots__ = ("name", "right", "stage", "subscribers")

    def __init__(self, stage: StageContext, subscribers: KeyValueStore, right: TableOp,
                 name: str) -> None:
        super().__init__()
        self.stage, self.subscribers, self.right, self.name = stage, subscribers, right, name

    def side(self, index: int) -> Op:
        return _Port(self.subscribed if index == 0 else self.changed)

    def subscribed(self, records: Records) -> None:
        keys = [str(r[0]) for r in records]
        table = self.subscribers.get_many(set(keys))
        values = self.right.lookup_many({r[0] for r in records})
        answers: list[SendRecord] = []
        for (fk, value, timestamp, _), key in zip(records, keys, strict=True):
            request = _unwire(value)
            subscribed = table.setdefault(key, {})
            if request["op"] == "unsub":
                subscribed.pop(json.dumps(request["lk"]), None)
                continue
            subscribed[json.dumps(request["lk"])] = request["h"]
            answers.append((request["lk"], _wire({"h": request["h"], "rv": values.get(fk)}),
                            timestamp, None))
        _send(self.stage, self.name, answers)
        self.subscribers.put_many({k: (v or None) for k, v in table.items()})

    def changed(self, records: Records) -> None:
        table = self.subscribers.get_many({str(r[0]) for r in records})
        _send(self.stage, self.name, [(json.loads(lk), _wire({"h": h, "rv": rv}), timestamp, None)
                                     for fk, rv, timestamp, _ in records
                                     for lk, h in table.get(str(fk), {}).items()])


class Result(CachedTable):
    """The joined table, stored: ``side(0)`` takes answers, ``side(1)`` the immediate
    results of ``Subscribe``. With ``times`` (the result is joined with another table),
    the time of each result it emitted is kept there too."""

    __slots__ = ("joiner", "left", "left_table", "store", "times")

    def __init__(self, store: KeyValueStore, left_table: TableOp,
                 joiner: Callable[[Any, Any], Any], left: bool, cache: bool, *,
                 times: Times | None = None) -> None:
        super().__init__(cache)
        self.store, self.left_table, self.joiner, self.left = store, left_table, joiner, left
        self.times = times

    def side(self, index: int) -> Op:
        return _Port(self.answered if index == 0 else self.settle)

    def answered(self, records: Records) -> None:
        current = self.left_table.lookup_many({r[0] for r in records})
        out: Records = []
        for lk, value, timestamp, headers in records:
            answer = _unwire(value)
            lv = current.get(lk)
            if lv is None or digest(lv) != answer["h"]:
                continue  # stale: the left row changed since it subscribed
            rv = answer["rv"]
            joined = self.joiner(lv, rv) if rv is not None or self.left else None
            out.append((lk, joined, timestamp, headers))
        self.settle(out)

    def settle(self, records: Records) -> None:
        if records:
            self.store.put_many({r[0]: r[1] for r in records})
            if self.times is not None:
                self.times.put_many({r[0]: None if r[1] is None else r[2] for r in records})
            self.update(records)

    def lookup_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return self.store.get_many(keys)

    def lookup_times(self, keys: Iterable[Any]) -> dict[Any, int]:
        return {} if self.times is None else self.times.get_many(keys)


def _send(stage: StageContext, name: str, records: list[SendRecord]) -> None:
    """A batch's requests or answers to repartition ``name``, in order, in one call."""
    if records:
        stage.repartition(name, records)


class _Port(Op):
    __slots__ = ("target",)

    def __init__(self, target: Callable[[Records], None]) -> None:
        super().__init__()
        self.target = target

    def push(self, records: Records) -> None:
        self.target(records)
