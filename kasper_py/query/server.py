"""The query server: a processor's tables and views over HTTP(S), apart from its metrics,
and what a runner mounts on it (``query_app``, over ``tables_for``). It binds
``Config.query_host`` (loopback by default) on ``Config.query_port``, asks for
``Config.query_token`` as a bearer token when one is set, and serves TLS when
``Config.query_tls_cert`` is. A request refused for its token is counted through
``rejected`` (the loop's observer).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence

import structlog

from kasper_py._support.query_settings import query_url
from kasper_py.config import Config
from kasper_py.exceptions import ConfigError
from kasper_py.observability.http import BearerGuard, Handler, HttpServer, tls_context
from kasper_py.query._locate import Locator
from kasper_py.query._tables import OpenStores, Tables, WarmElsewhere
from kasper_py.query._web import QueryApp, View
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.query import WarmStores

__all__ = ["QUERY_PATHS", "OpenStores", "QueryServer", "WarmElsewhere", "query_app",
           "tables_for"]

_log = structlog.get_logger("kasper_py")
QUERY_PATHS = ("/tables",)


class QueryServer(HttpServer):
    """Serves the apps mounted on it (the tables and views: ``QueryApp``) as ``config``
    says; raises ``ConfigError`` naming the field when the TLS files do not load or the
    port cannot be bound."""

    def __init__(self, config: Config,
                 rejected: Callable[[str], None] = lambda reason: None) -> None:
        assert config.query_port is not None  # the caller serves queries only when set
        guard = BearerGuard(config.query_token, rejected) if config.query_token else None
        try:
            super().__init__(config.query_host, config.query_port, name="queries",
                             paths=QUERY_PATHS, guard=guard, tls=_tls(config))
        except OSError as exc:
            raise ConfigError("query_port", f"cannot listen on {config.query_host}:"
                              f"{config.query_port}: {exc.strerror or exc}") from None
        self.endpoint = query_url(config, self.port)
        """The URL other instances redirect to, announced in the commit notes."""
        _log.info("kasper.queries_serving", processor=config.name, host=self.host,
                  port=self.port, tls=self.scheme == "https", token=guard is not None,
                  endpoint=self.endpoint)


def tables_for(config: Config, specs: Sequence[StoreSpec], open_stores: OpenStores, *,
               endpoint: str | None = None, locate: bool = False,
               partition_count: Callable[[], int | None] = lambda: None,
               warm: WarmStores = dict,
               stage_count: Callable[[str], int | None] = lambda _table: None,
               warm_elsewhere: WarmElsewhere = lambda _partition: ()) -> Tables:
    """The queryable tables of a processor's ``specs``, reading ``open_stores``. With
    ``locate`` (real Kafka clients) a key of a partition held elsewhere is found from the
    running loops' commit notes; ``endpoint`` is this instance's own URL.
    ``partition_count`` gives the input topics' partitions once the loop knows them;
    ``warm`` the standby copies kept here, which answer ``stale`` lookups;
    ``stage_count`` a table's stage's own partition count (``Tables``);
    ``warm_elsewhere`` where other instances keep a partition warm (``?stale=ok``)."""
    return Tables(config, specs, open_stores, Locator(config, endpoint) if locate else None,
                  partition_count, warm=warm, stage_count=stage_count,
                  warm_elsewhere=warm_elsewhere)


def query_app(tables: Tables, views: Mapping[str, View], endpoint: str | None) -> Handler:
    """``tables`` (``/tables...``) and ``views`` as one app to mount on a ``QueryServer``
    whose URL is ``endpoint``. Raises ``ValueError`` for a view path that is malformed
    or taken by kasper_py's own."""
    return QueryApp(tables, views, endpoint)


def _tls(config: Config) -> ssl.SSLContext | None:
    if config.query_tls_cert is None or config.query_tls_key is None:
        return None
    try:
        return tls_context(config.query_tls_cert, config.query_tls_key)
    except FileNotFoundError as exc:
        raise ConfigError("query_tls_cert", f"file not found: {exc.filename}") from None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("query_tls_cert", "the certificate and key "
                          f"({config.query_tls_cert}, {config.query_tls_key}) do not "
                          f"load: {exc}") from None

