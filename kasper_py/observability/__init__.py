"""What an operator sees of a running processor: Prometheus metrics and health
(``metrics``, its collectors in ``collectors``), the loop's and stores' reporting ports
with their no-op defaults (``observe``), structlog setup (``logging``) and the one HTTP
server every endpoint runs on (``http``); ``metrics`` also counts the Kafka clients' log
lines (``kafka.client_log``). Importing the package imports none of them:
prometheus-client stays optional.
"""
