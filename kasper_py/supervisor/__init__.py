"""``kasper run --processes N``: one processor on every core. A supervisor process
starts N worker processes (``kasper run`` each, on disjoint static partition sets or all
in the consumer group), forwards SIGTERM/SIGINT so each finishes and commits its batch,
restarts a worker that dies (with backoff, saying why), and serves one endpoint for the
lot: ``/health/live`` and ``/health/ready`` over every worker, ``/workers`` listing the
workers' ``/metrics`` (Prometheus ``http_sd`` format) and ``/metrics`` of its own.
"""

from kasper_py.supervisor._supervisor import (
    Supervisor,
    WorkerSpec,
    split_partitions,
    standby_sets,
)

__all__ = ["Supervisor", "WorkerSpec", "split_partitions", "standby_sets"]
