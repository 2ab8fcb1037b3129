"""Small helpers private to kasper_py (any of its packages may use them): a ``Config``'s
librdkafka settings (``client_conf``), closing many things at once (``closing``),
garbage-collector pacing for big batches (``gc``), package facades whose names are
imported on first use (``lazy``), ``module:attr`` name resolution (``names``), the
masking of secrets (``secrets``) and the stop signals held before a loop takes them
over (``signals``).
"""
