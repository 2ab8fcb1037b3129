"""Runs a streaming query of ``TaggedCount`` (effectively-once Redis counts) on a
local[2] session until the input's end is committed; the kill test kills it with -9.

    python stream_worker.py BOOTSTRAP TOPIC OUTPUT GROUP CHECKPOINT
"""

from __future__ import annotations

import sys
from functools import partial

import reprocess_processors as procs

from kasper_py import Config
from kasper_py.reprocess import spark_session
from kasper_py.stream import stream


def main() -> None:
    bootstrap, topic, output, group, checkpoint = sys.argv[1:6]
    session = spark_session("local[2]", conf={"spark.ui.enabled": "false",
                                              "spark.ui.showConsoleProgress": "false"})
    session.sparkContext.addPyFile(procs.__file__)
    config = Config(name=group, bootstrap_servers=bootstrap, input_topics=[topic],
                    batch_size=200)
    run = stream(config, partial(procs.TaggedCount, output=output), checkpoint=checkpoint,
                 stores=procs.exact_counts(config), trigger=0.2, spark=session,
                 kafka_options={"maxOffsetsPerTrigger": "400"})
    try:
        run.await_caught_up(timeout=240)
    finally:
        run.stop()
        session.stop()


if __name__ == "__main__":
    main()
