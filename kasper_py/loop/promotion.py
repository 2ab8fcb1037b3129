"""Promotion of a static standby in its running process, and its way back: the admin
endpoint's requests (``POST /standby/promote?partitions=0``, ``POST
/standby/release?partitions=0``) handed to the loop, which serves them between two turns
(``StaticAssignment.after_consume``), never inside one. The request's thread waits for
the answer: the partitions owned or released (records restored, ids fenced, offsets
committed), or why not. What each does is the assignment's; this module carries them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kasper_py.config import Config
from kasper_py.exceptions import KasperError
from kasper_py.loop.prefetch import Schedule
from kasper_py.observability.http import Handler, Request, Response, error_response

__all__ = ["PROMOTE_PATH", "RELEASE_PATH", "Handover", "PromotionRefusedError", "Promotions",
           "promotions_for"]

PROMOTE_PATH = "/standby/promote"
RELEASE_PATH = "/standby/release"
_WAKE_STEP = 0.02
"""Longest a consume of a loop serving promotions waits before it looks for a request."""
_WAIT = 600.0
"""Seconds a request waits for the loop by default (a full restore can take minutes)."""

Handover = Callable[[tuple[int, ...], "str | None"], dict[str, Any]]
"""Takes partitions over (the previous owner's partition set, if given), or releases
them; the answer."""
_ACTIONS = {PROMOTE_PATH: "promote", RELEASE_PATH: "release"}


class PromotionRefusedError(KasperError):
    """A promotion or release the loop refuses before changing anything: ``status`` is
    its HTTP status (400 a bad request, 404 unknown partitions, 409 partitions owned here,
    or, to release, not owned here or the last ones)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Ask:
    action: str
    partitions: tuple[int, ...]
    previous: str | None
    done: threading.Event = field(default_factory=threading.Event)
    answer: Response | None = None


class Promotions:
    """The requests waiting for the loop. ``refusal``: why this loop takes none (group
    mode promotes on assignment), answered at once with 409. ``served``: requests can
    come (the admin endpoint is up), so an idle loop looks for them often (``waking``)."""

    def __init__(self, refusal: str | None = None, *, served: bool = False) -> None:
        self._refusal, self._served = refusal, served
        self._waiting: queue.SimpleQueue[_Ask] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def ask(self, partitions: tuple[int, ...], previous: str | None,
            timeout: float = _WAIT, *, action: str = "promote") -> Response:
        """From a request's thread: wait for the loop to ``action`` (promote, or
        release) ``partitions``."""
        if self._refusal is not None:
            return error_response(409, self._refusal, "PromotionRefused")
        ask = _Ask(action, partitions, previous)
        with self._lock:
            if self._closed:
                return error_response(503, "the loop is stopping", "PromotionRefused")
            self._waiting.put(ask)
        if not ask.done.wait(timeout):
            return error_response(504, f"the loop did not take the request within "
                                  f"{timeout:g}s (it will still {action} {list(partitions)} "
                                  "at its next turn boundary)", "PromotionPending")
        assert ask.answer is not None
        return ask.answer

    def waking(self, schedule: Schedule) -> Schedule:
        """``schedule``, also due while a request waits, so that the consume of an idle
        loop ends within ``_WAKE_STEP`` of one; as it is when no request can come."""
        return _Waking(schedule, self._waiting) if self._served else schedule

    def waiting(self) -> bool:
        """True when a request waits to be served (a look, without taking it)."""
        return not self._waiting.empty()

    def serve(self, handovers: dict[str, Handover]) -> None:
        """On the loop's thread, between turns: each waiting request served by the
        handover its action names (``promote``, ``release``). A refusal
        changes nothing and is answered; any other failure is answered, then raised (the
        loop stops, this turn uncommitted, as when a turn fails)."""
        while True:
            try:
                ask = self._waiting.get_nowait()
            except queue.Empty:
                return
            try:
                ask.answer = Response(handovers[ask.action](ask.partitions, ask.previous))
            except PromotionRefusedError as exc:
                ask.answer = error_response(exc.status, str(exc), "PromotionRefused")
            except BaseException as exc:
                ask.answer = error_response(500, f"{type(exc).__name__}: {exc}",
                                            "PromotionFailed")
                raise
            finally:
                ask.done.set()

    def close(self) -> None:
        """The loop stops: refuse new requests, answer the waiting ones with 503."""
        with self._lock:
            self._closed = True
        while True:
            try:
                ask = self._waiting.get_nowait()
            except queue.Empty:
                return
            ask.answer = error_response(503, f"the loop stopped before it could {ask.action}",
                                        "PromotionRefused")
            ask.done.set()

    def app(self) -> Handler:
        """``POST /standby/promote?partitions=0,2[&previous=0-1][&timeout=60]``:
        ``previous`` names the old owner's partition set, whose transactional id
        (``<name>@<set>``) exactly-once fences besides those it finds itself;
        ``POST /standby/release?partitions=0,2[&timeout=60]``: the way back."""

        def promote(request: Request) -> Response | None:
            action = _ACTIONS.get(request.path)
            if action is None:
                return None
            try:
                partitions, timeout = _partitions(request), float(
                    request.params.get("timeout", _WAIT))
            except ValueError as exc:
                return error_response(400, str(exc), "BadRequest")
            return self.ask(partitions, request.params.get("previous") or None, timeout,
                            action=action)

        return promote


class _Waking:
    """A loop's schedule that also falls due when a promotion or release request waits."""

    def __init__(self, schedule: Schedule, waiting: queue.SimpleQueue[_Ask]) -> None:
        self._schedule, self._waiting = schedule, waiting

    def due(self) -> bool:
        return not self._waiting.empty() or self._schedule.due()

    def seconds_until_due(self) -> float | None:
        wait = self._schedule.seconds_until_due()
        return _WAKE_STEP if wait is None else min(wait, _WAKE_STEP)


def _partitions(request: Request) -> tuple[int, ...]:
    text = request.params.get("partitions", "")
    try:
        partitions = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise ValueError(f"partitions must be comma-separated numbers, got {text!r}") \
            from None
    if not partitions or min(partitions) < 0:
        raise ValueError(f"partitions must name one partition or more, got {text!r}")
    return partitions


def promotions_for(config: Config) -> Promotions:
    """The promotions and releases a loop of ``config`` takes: a static loop's; a group
    member refuses them (the group's assignment moves partitions, and promotes warm
    copies)."""
    if config.group_mode:
        return Promotions(refusal="group mode: the group assigns and revokes partitions "
                          "(a member promotes a warm copy when the group assigns it the "
                          "partition); stop the owner, or the member, instead")
    return Promotions(served=config.admin_port is not None)
