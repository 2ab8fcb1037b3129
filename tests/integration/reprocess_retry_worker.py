"""Runs one reprocessing job on a local[2,2] session, where Spark retries a failed task
once (plain local[N] never retries). Prints the outcome as JSON for the test.

    python reprocess_retry_worker.py BOOTSTRAP TOPIC OUTPUT GROUP MARKER
"""

from __future__ import annotations

import json
import sys
from functools import partial

import reprocess_processors as procs

from kasper_py import Config, ReprocessError
from kasper_py.reprocess import reprocess, spark_session


def main() -> None:
    bootstrap, topic, output, group, marker = sys.argv[1:6]
    session = spark_session("local[2,2]", conf={"spark.ui.enabled": "false",
                                                "spark.ui.showConsoleProgress": "false"})
    session.sparkContext.addPyFile(procs.__file__)
    config = Config(name=group, bootstrap_servers=bootstrap, input_topics=[topic])
    try:
        reprocess(config, partial(procs.FailsFirstAttempt, output=output, marker=marker),
                  handoff=True, spark=session)
        print(json.dumps({"error": None}))
    except ReprocessError as exc:
        print(json.dumps({"error": str(exc)}))
    finally:
        session.stop()


if __name__ == "__main__":
    main()
