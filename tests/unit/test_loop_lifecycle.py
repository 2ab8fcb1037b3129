"""How a loop stops (``kasper_py.loop.lifecycle``, ``kasper_py.loop.signals``): close from
another thread waits for the loop, from the loop's own thread (a signal handler) it
returns at once, the shutdown runs once; SIGTERM closes, a second signal interrupts; a
signal ``kasper run`` held while it started (``kasper_py._support.signals``) is taken
over by the loop or the supervisor, and ``kasper``'s entry point imports nothing heavy
before it holds them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from kasper_py import CommitError, ProduceError
from kasper_py._support.signals import held_signal, holding_stop_signals
from kasper_py.exceptions import KasperError
from kasper_py.loop.lifecycle import Lifecycle, kafka_usable_after
from kasper_py.loop.signals import closing_on_signals
from kasper_py.supervisor import Supervisor, WorkerSpec


def test_closing_a_loop_that_is_not_running_shuts_it_down_at_once() -> None:
    life, shutdowns = Lifecycle(), []
    life.close(lambda: shutdowns.append(life.shut_once()))
    life.close(lambda: shutdowns.append(life.shut_once()))
    assert shutdowns == [True, False] and life.closing.is_set() and life.shut


def test_closing_from_another_thread_waits_for_the_loop_to_stop() -> None:
    life, order = Lifecycle(), []
    inside, release = threading.Event(), threading.Event()

    def loop() -> None:
        with life.running():
            inside.set()
            release.wait(5)
            order.append("loop stopped")

    thread = threading.Thread(target=loop)
    thread.start()
    inside.wait(5)
    threading.Timer(0.05, release.set).start()
    life.close(lambda: order.append("shutdown by close"), timeout=5)
    order.append("close returned")
    thread.join(5)
    assert order == ["loop stopped", "close returned"]


def test_closing_from_the_loops_own_thread_returns_at_once() -> None:
    """A signal handler runs on the loop's thread: it only asks the loop to stop."""
    life, shutdowns = Lifecycle(), []
    with life.running():
        life.close(lambda: shutdowns.append(1), timeout=5)
        assert life.closing.is_set()
    assert shutdowns == []


@pytest.mark.parametrize(("error", "usable"), [
    (ProduceError("x"), False), (CommitError("x"), False), (KeyboardInterrupt(), False),
    (KasperError("a processor raised"), True), (ValueError("x"), True)])
def test_kafka_trouble_leaves_no_last_commit(error: BaseException, usable: bool) -> None:
    assert kafka_usable_after(error) is usable


def test_sigterm_closes_and_a_second_signal_interrupts() -> None:
    closed: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), closing_on_signals(lambda: closed.append(1),
                                                              "p") as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        assert caught == ["SIGTERM"] and closed == [1]
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_are_refused_off_the_main_thread() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with closing_on_signals(lambda: None, "p"):
                pass
        except KasperError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(5)
    assert "must be called from the main thread" in str(errors[0])


def test_kasper_holds_the_stop_signals_before_importing_the_library() -> None:
    """``import kasper_py.cli`` (the console script's first line) loads the signal
    holder and nothing else of the library (but the package's lazy-name helper, which
    imports only the standard library): the imports a signal could otherwise kill the
    process in (half a second of them) come after ``main`` holds the signals."""
    code = ("import sys, kasper_py.cli; print(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('kasper_py', 'confluent_kafka', 'structlog')))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout
    assert found.strip() == str(["kasper_py", "kasper_py._support", "kasper_py._support.lazy",
                                 "kasper_py._support.signals", "kasper_py.cli"])


def test_a_signal_held_at_start_is_taken_over_by_the_loop() -> None:
    """A SIGTERM while ``kasper run`` starts is only recorded; the loop's handlers take
    it over (closing at once, nothing runs); a second signal while starting interrupts;
    on the way out the previous handlers are back and nothing stays held."""
    before, closed = signal.getsignal(signal.SIGTERM), []
    with holding_stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        assert held_signal() == "SIGTERM"
        with closing_on_signals(lambda: closed.append(1), "p") as caught:
            assert caught == ["SIGTERM"] and closed == [1] and held_signal() is None
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before and held_signal() is None


def test_a_signal_held_at_start_stops_the_supervisor_before_any_worker() -> None:
    """``kasper run --processes N`` stopped while it started starts no worker: exit 0."""
    started: list[list[str]] = []
    supervisor = Supervisor([WorkerSpec(0, ["never"])],
                            popen=lambda command, env=None: started.append(command))
    with holding_stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        assert supervisor.run() == 0
    assert started == [] and supervisor._stopping == "SIGTERM"
