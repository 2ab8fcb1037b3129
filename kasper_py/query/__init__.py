"""Interactive queries: read a running processor's tables over HTTP (on its query
server, ``Config.query_port``, apart from the metrics) or in-process, find the
instance holding a key, and serve views of your own.

- ``Tables`` (``TopicProcessor.tables``): ``get``, ``scan``, ``windows``, ``describe``
  of committed state, from any thread.
- ``QueryClient``: the same over HTTP from another process.
- ``Request``, ``Response``, ``View``: a view is ``(request, tables) -> response``,
  registered with ``TopicProcessor(..., views={"/path": view})``.
- ``partition_for``, ``murmur2``: the partitioners (``Config.query_partitioner``);
  ``Lookup``: a value and the hint given when its key was where another partitioner
  puts it (``Tables.find``, ``QueryClient.find``).
"""

from __future__ import annotations

from kasper_py.observability.http import Request, Response
from kasper_py.query._partitioner import PARTITIONERS, Partitioner, murmur2, partition_for
from kasper_py.query._tables import Lookup, Tables
from kasper_py.query._web import View
from kasper_py.query.client import QueryClient
from kasper_py.stores.query import Scan

__all__ = ["PARTITIONERS", "Lookup", "Partitioner", "QueryClient", "Request", "Response", "Scan",
           "Tables", "View", "murmur2", "partition_for"]
