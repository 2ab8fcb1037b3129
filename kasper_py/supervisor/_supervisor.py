"""The supervisor of ``kasper run --processes N``: worker processes, signals, restarts
and the endpoint over all of them. What a worker does is ``kasper run``'s; nothing
here touches Kafka."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kasper_py._support.signals import STOPPING, take_held
from kasper_py.observability.http import Handler, HttpServer, Request, Response

__all__ = ["Supervisor", "WorkerSpec", "restart_backoff", "split_partitions", "standby_sets"]

_log = structlog.get_logger("kasper_py")
_TICK = 0.2
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 30.0
_STEADY = 60.0
"""A worker that ran this long before dying restarts at once (its backoff resets)."""


def restart_backoff(ran: float, failures: int) -> tuple[int, float]:
    """A worker that died after running ``ran`` seconds, having died ``failures`` times
    in a row before: its failures now, and the seconds to wait before its restart. A
    worker that ran ``_STEADY`` seconds restarts at once (its partitions wait for
    nothing else: part of a failover); one dying again soon after waits 1 s, doubling up
    to 30 s."""
    failures = 0 if ran >= _STEADY else failures + 1
    if failures == 0:
        return 0, 0.0
    return failures, min(_BACKOFF_FIRST * 2 ** (failures - 1), _BACKOFF_MAX)


def split_partitions(partitions: Sequence[int], workers: int) -> list[list[int]]:
    """``partitions`` dealt into ``workers`` contiguous, even runs (sizes differ by at
    most one); ``ValueError`` when there are more workers than partitions."""
    if not 1 <= workers <= len(partitions):
        raise ValueError(f"{workers} worker processes for {len(partitions)} partitions: "
                         "each worker needs at least one partition")
    size, extra = divmod(len(partitions), workers)
    runs, start = [], 0
    for index in range(workers):
        end = start + size + (1 if index < extra else 0)
        runs.append(list(partitions[start:end]))
        start = end
    return runs


def standby_sets(sets: Sequence[Sequence[int] | None], replicas: int) -> list[list[int]]:
    """What each worker keeps warm with ``replicas`` standbys per partition: worker ``i``
    the partitions of workers ``i+1 .. i+replicas`` (wrapping), so every partition is warm
    in ``min(replicas, N-1)`` other workers. None in group mode (``None`` sets): members
    place their standbys themselves."""
    count = min(replicas, len(sets) - 1)
    if count <= 0 or any(owned is None for owned in sets):
        return [[] for _ in sets]
    return [sorted(p for k in range(1, count + 1) for p in sets[(i + k) % len(sets)] or ())
            for i in range(len(sets))]


@dataclass
class WorkerSpec:
    """One worker: its command line, and the port of its ``/metrics``, if any."""

    index: int
    command: list[str]
    metrics_port: int | None = None


@dataclass
class _Worker:
    spec: WorkerSpec
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    failures: int = 0
    restart_at: float | None = None
    done: bool = False


@dataclass
class Supervisor:
    """Runs ``workers`` until each exits 0 (``--until-caught-up``) or a signal stops
    them all; ``run()`` returns the exit code."""

    workers: Sequence[WorkerSpec]
    env: Mapping[str, str] | None = None
    metrics: tuple[str, int] | None = None
    """(host, port) of the supervisor's endpoint; ``None`` serves none."""
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen
    _state: list[_Worker] = field(default_factory=list, init=False)
    _stopping: str | None = field(default=None, init=False)

    def run(self) -> int:
        """Start every worker, supervise, and return 0 when all ended well."""
        self._state = [_Worker(spec) for spec in self.workers]
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOPPING}
        self._stopping = take_held() or self._stopping  # one while `kasper run` started
        server = self._serve()
        try:
            for worker in self._state:
                if self._stopping is None:
                    self._start(worker)
                else:
                    worker.done = True
            while not all(worker.done for worker in self._state):
                time.sleep(_TICK)
                for worker in self._state:
                    self._tend(worker)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if server is not None:
                server.close()
        codes = [w.process.returncode for w in self._state if w.process is not None]
        _log.info("kasper.supervisor_stopped", workers=len(self._state), exit_codes=codes,
                  signal=self._stopping)
        return 0 if all(code == 0 for code in codes) else 1

    # -- workers ----------------------------------------------------------------------

    def _start(self, worker: _Worker) -> None:
        worker.process = self.popen(worker.spec.command, env=self.env)
        worker.started, worker.restart_at = time.monotonic(), None
        if self._stopping is not None:  # the signal came while it was being started
            worker.process.send_signal(signal.SIGTERM)
        _log.info("kasper.worker_started", worker=worker.spec.index, pid=worker.process.pid,
                  restarts=worker.restarts, metrics_port=worker.spec.metrics_port)

    def _tend(self, worker: _Worker) -> None:
        """Notice a worker that ended; restart a failed one when its backoff is over."""
        if worker.done:
            return
        if worker.restart_at is not None:
            if self._stopping is not None:
                worker.done = True
            elif time.monotonic() >= worker.restart_at:
                worker.restarts += 1
                self._start(worker)
            return
        assert worker.process is not None
        code = worker.process.poll()
        if code is None:
            return
        if code == 0 or self._stopping is not None:
            worker.done = True
            return
        ran = time.monotonic() - worker.started
        worker.failures, backoff = restart_backoff(ran, worker.failures)
        worker.restart_at = time.monotonic() + backoff
        why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        _log.warning("kasper.worker_died", worker=worker.spec.index, pid=worker.process.pid,
                     why=why, ran_seconds=round(ran, 1), restart_in_seconds=backoff)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Forward SIGTERM: each worker finishes and commits its batch, then exits. A
        second signal is forwarded too (a worker then stops at once, uncommitted)."""
        self._stopping = signal.Signals(signum).name
        for worker in self._state:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)

    # -- the endpoint -------------------------------------------------------------------

    def _serve(self) -> HttpServer | None:
        if self.metrics is None:
            return None
        server = HttpServer(*self.metrics, name="supervisor", apps=[_app(self)],
                            paths=["/health/live", "/health/ready", "/workers", "/metrics"])
        _log.info("kasper.supervisor_serving", host=self.metrics[0], port=server.port,
                  workers=[w.metrics_port for w in self.workers])
        return server

    def health(self, which: str) -> tuple[bool, dict[str, Any]]:
        """``live``/``ready`` of every worker (by its own endpoint): ok when all are."""
        answers: dict[str, Any] = {}
        for worker in self._state:
            port = worker.spec.metrics_port
            alive = worker.process is not None and worker.process.poll() is None
            if port is None or not alive:
                answers[str(worker.spec.index)] = {"ok": False, "running": alive}
                continue
            answers[str(worker.spec.index)] = {"ok": _get_ok(f"http://127.0.0.1:{port}"
                                                             f"/health/{which}")}
        return all(a["ok"] for a in answers.values()), answers

    def targets(self) -> list[dict[str, Any]]:
        """The workers' ``/metrics`` endpoints, as Prometheus ``http_sd_configs`` reads."""
        return [{"targets": [f"127.0.0.1:{w.metrics_port}"],
                 "labels": {"kasper_worker": str(w.index)}}
                for w in self.workers if w.metrics_port is not None]

    def exposition(self) -> bytes:
        """The supervisor's own metrics, in Prometheus' text format."""
        running = sum(1 for w in self._state if w.process is not None
                      and w.process.poll() is None)
        lines = ["# HELP kasper_supervisor_workers_running Worker processes running.",
                 "# TYPE kasper_supervisor_workers_running gauge",
                 f"kasper_supervisor_workers_running {running}",
                 "# HELP kasper_supervisor_worker_restarts_total Workers restarted after "
                 "dying, by worker.",
                 "# TYPE kasper_supervisor_worker_restarts_total counter"]
        lines += [f'kasper_supervisor_worker_restarts_total{{worker="{w.spec.index}"}} '
                  f"{w.restarts}" for w in self._state]
        return ("\n".join(lines) + "\n").encode()


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _app(supervisor: Supervisor) -> Handler:
    def answer(request: Request) -> Response | None:
        if request.path in ("/health/live", "/health/ready"):
            ok, answers = supervisor.health(request.path.rsplit("/", 1)[1])
            return Response({"ok": ok, "workers": answers}, 200 if ok else 503)
        if request.path == "/workers":
            return Response(supervisor.targets())
        if request.path == "/metrics":
            return Response(supervisor.exposition(), content_type="text/plain; version=0.0.4")
        return None

    return answer
