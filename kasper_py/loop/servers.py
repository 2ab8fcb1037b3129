"""The HTTP servers a loop owns, each with its app mounted explicitly:

- metrics (``/metrics``, ``/health/*``) on ``Config.metrics_host:metrics_port``, for
  the Prometheus observer the loop builds itself when no observer is passed (one passed
  in is served, or not, by whoever made it: ``metrics.observer_for``);
- queries (the tables and views) on ``Config.query_port``, loopback unless chosen: apart
  from the metrics on purpose, since metrics are public by convention and the
  application's state is not;
- admin (``POST /standby/promote``) on ``Config.admin_port``, loopback only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import structlog

from kasper_py.config import Config
from kasper_py.loop.promotion import PROMOTE_PATH, RELEASE_PATH, Promotions
from kasper_py.loop.standby_placement import WarmEndpoints
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.http import HttpServer
from kasper_py.observability.observe import (
    LoopObserver,
    NoopObserver,
    StoreObserver,
    with_store_observer,
)
from kasper_py.query import Tables, View
from kasper_py.query.server import QueryServer, WarmElsewhere, query_app, tables_for
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import Queryable, WarmStores
from kasper_py.turn import PartitionState

__all__ = ["LoopServers", "stage_counts"]

Step = Callable[[], object]
_log = structlog.get_logger("kasper_py")


class LoopServers:
    """The loop's observer (``observer``, else one built from ``config``) and the servers
    the loop started; closed by the loop, in the order its shutdown needs."""

    def __init__(self, config: Config, observer: LoopObserver | None,
                 store_observer: StoreObserver | None = None) -> None:
        """Raises ``OSError`` when the metrics port cannot be bound, ``ImportError``
        without prometheus-client. ``store_observer`` also hears the stores' reports."""
        self.config = config
        self.queries: QueryServer | None = None
        """Serves the tables and views, once ``serve_tables`` started it."""
        self.metrics: HttpServer | None = None
        """Serves the metrics of the observer the loop built, if it did."""
        self.admin: HttpServer | None = None
        """Serves the admin endpoint, once ``serve_admin`` started it."""
        self._closes: list[Step] = []
        """Closes what the loop built: its metrics server, its observer."""
        self.observer = observer or self._own_observer()
        if store_observer is not None:
            self.observer = with_store_observer(self.observer, store_observer)

    def _own_observer(self) -> LoopObserver:
        """Prometheus metrics served on ``config.metrics_port`` when it is set, else none."""
        if self.config.metrics_port is None:
            return NoopObserver()
        from kasper_py.observability.metrics import (  # noqa: PLC0415 - prometheus-client is optional
            MetricsServer,
            PrometheusObserver,
        )

        observer = PrometheusObserver(self.config)
        try:
            server = MetricsServer(observer, self.config.metrics_host, self.config.metrics_port)
        except BaseException:
            observer.close()
            raise
        _log.info("kasper.metrics_serving", processor=self.config.name, host=server.host,
                  port=server.port)
        self.metrics = server
        self._closes = [server.close, observer.close]
        return observer

    def serve_tables(self, specs: Sequence[StoreSpec], partitions: Mapping[int, PartitionState],
                     views: Mapping[str, View], *, locate: bool,
                     partition_count: Callable[[], int | None] = lambda: None,
                     warm: WarmStores = dict,
                     stage_count: Callable[[str], int | None] = lambda _table: None
                     ) -> Tables:
        """The tables of ``specs`` in the open ``partitions`` (the turn engine's); served
        with ``views`` on a query server of their own when ``config.query_port`` is set.
        With ``locate`` (real Kafka clients) they find other instances from commit notes.
        ``partition_count`` gives the input topics' partitions once the loop started;
        ``warm`` the standby copies kept here (answering ``?stale=ok``); ``stage_count``
        a table's stage's own partition count, by which its keys are routed.
        Raises ``ConfigError`` (the query port or its TLS files) or ``ValueError`` (a view
        path; views without a query port)."""

        def open_stores() -> dict[int, dict[str, Queryable]]:
            # read from query threads, so copied whole (atomic under the GIL) first
            return {p: {**state.stores, **state.query_tables}
                    for p, state in dict(partitions).items()}

        if self.config.query_port is None:
            if views:
                raise ValueError("views are served on the query server: set "
                                 "Config.query_port")
            return tables_for(self.config, specs, open_stores, partition_count=partition_count,
                              warm=warm, stage_count=stage_count)
        server = QueryServer(self.config, self.observer.on_query_rejected)
        try:
            tables = tables_for(self.config, specs, open_stores, endpoint=server.endpoint,
                                locate=locate, partition_count=partition_count, warm=warm,
                                stage_count=stage_count,
                                warm_elsewhere=self._warm_elsewhere(locate))
            server.mount(query_app(tables, views, server.endpoint))
        except BaseException:
            server.close()
            raise
        self.queries = server
        return tables

    def _warm_elsewhere(self, locate: bool) -> WarmElsewhere:
        """Group members with standbys find the others keeping a partition warm from the
        group's description (``WarmEndpoints``); otherwise no instance is known."""
        if locate and self.config.group_mode and self.config.num_standby_replicas > 0:
            return WarmEndpoints(self.config)
        return lambda _partition: ()

    def serve_admin(self, promotions: Promotions) -> None:
        """The admin endpoint (``POST /standby/promote``, ``/standby/release``) on 127.0.0.1's
        ``config.admin_port``, when it is set: loopback only, whatever the other servers
        bind, since it changes what this process owns (an operator or a supervisor on
        the host asks it: ``kasper standby promote``, ``release``)."""
        if self.config.admin_port is None:
            return
        server = HttpServer("127.0.0.1", self.config.admin_port, name="admin",
                            paths=[PROMOTE_PATH, RELEASE_PATH])
        server.mount(promotions.app(), post=True)
        self.admin = server
        _log.info("kasper.admin_serving", processor=self.config.name, host=server.host,
                  port=server.port)

    @property
    def admin_address(self) -> tuple[str, int] | None:
        """(host, port) of the admin endpoint, if served (the bound port for port 0)."""
        return None if self.admin is None else (self.admin.host, self.admin.port)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of the metrics server, the bound port when ``Config.metrics_port``
        is 0; None when the loop serves no metrics."""
        return None if self.metrics is None else (self.metrics.host, self.metrics.port)

    @property
    def endpoint(self) -> str | None:
        """The URL the query server answers on, announced in the commit notes."""
        return self.queries.endpoint if self.queries is not None else None

    def closing_queries(self) -> list[Step]:
        """Stops answering queries and admin requests: first at shutdown, before the
        stores close."""
        servers = (self.admin, self.queries)
        return [server.close for server in servers if server is not None]

    def closing_metrics(self) -> list[Step]:
        """Stops the metrics server and the observer the loop built: last at shutdown,
        after the observer saw the loop stop."""
        return list(self._closes)


def stage_counts(store_topics: Mapping[str, frozenset[str]],
                 keys: Callable[[Sequence[int]], list[TopicPartitionKey]],
                 partition_count: Callable[[], int | None]) -> Callable[[str], int | None]:
    """A table's stage's partition count: how many partitions the topics its processor
    reads have (``store_topics``, from the app's plan), counted in the consumer's
    ``keys`` of every partition number; ``None`` for a table of no such stage, or
    before the loop knows its partition count."""
    known: dict[tuple[str, int], int | None] = {}

    def count(table: str) -> int | None:
        topics, numbers = store_topics.get(table), partition_count()
        if not topics or numbers is None:
            return None
        if (table, numbers) not in known:
            held = Counter(topic for topic, _ in keys(range(numbers)) if topic in topics)
            known[(table, numbers)] = max(held.values(), default=0) or None
        return known[(table, numbers)]

    return count
