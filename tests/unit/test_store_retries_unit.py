"""``stores.retries.with_retries``: the retry loop the remote stores share. Retriable
failures are tried again with doubling backoff and end in ``StoreUnavailableError``;
other errors pass through at once; every attempt is counted."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kasper_py.exceptions import StoreUnavailableError
from kasper_py.stores import retries
from kasper_py.stores.retries import with_retries


@dataclass
class Policy:
    retries: int = 2
    backoff: float = 0.1
    max_backoff: float = 0.15
    timeout: float = 3.0


def test_retriable_failures_back_off_then_the_store_is_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three attempts (two retries, waiting 0.1 then 0.15 s, capped), each dropping the
    connection; the error says where, what, how often and the cause; all counted."""
    slept: list[float] = []
    monkeypatch.setattr(retries.time, "sleep", slept.append)
    counted, dropped = [], []

    def request() -> None:
        raise ConnectionError("refused")

    with pytest.raises(StoreUnavailableError) as info:
        with_retries(Policy(), request, retriable=(ConnectionError,), where="redis h:1",
                     what="MGET for table 'counts' partition 0", counted=counted.append,
                     before_retry=lambda: dropped.append(1))
    assert str(info.value) == ("redis h:1 unreachable: MGET for table 'counts' partition 0 "
                               "failed 3 times (each waiting up to 3s): refused")
    assert isinstance(info.value.__cause__, ConnectionError)
    assert (slept, counted, len(dropped)) == ([0.1, 0.15], [3], 3)


def test_a_success_after_a_retry_and_other_errors_pass_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that fails once answers on the second attempt (2 counted); an error not
    retriable is raised as it is after one attempt."""
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    counted: list[int] = []
    answers = iter([ConnectionError("once"), "ok"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert with_retries(Policy(), flaky, retriable=(ConnectionError,), where="w", what="x",
                        counted=counted.append) == "ok"

    def bad() -> None:
        raise ValueError("no such command")

    with pytest.raises(ValueError, match="no such command"):
        with_retries(Policy(), bad, retriable=(ConnectionError,), where="w", what="x",
                     counted=counted.append)
    assert counted == [2, 1]
