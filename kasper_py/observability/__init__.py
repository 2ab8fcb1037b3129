"""What an operator sees of a running processor: Prometheus metrics and health
(``metrics``, its collectors in ``collectors``), the loop's and stores' reporting ports
with their no-op defaults (``observe``), structlog setup (``logging``), the Kafka
clients' own log lines (``client_log``) and the one HTTP server every endpoint runs on
(``http``). Importing the package imports none of them: prometheus-client stays optional.
"""
