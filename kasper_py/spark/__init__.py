"""What every Spark runner shares: the session and the partition-wise job machinery
(``session``: building or joining a session, the Kafka source options, shipping the
user's code to executors, running a job and reading its stats) and the task that runs
the turn engine over one partition's records on an executor (``task``). The front
ends are ``kasper_py.reprocess`` (history, in bulk) and ``kasper_py.stream`` (live,
Structured Streaming). Importing the package imports neither PySpark nor a module.
"""
