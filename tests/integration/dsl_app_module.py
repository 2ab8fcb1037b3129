"""A small streams-DSL app for `kasper app describe`: lines of ``describe-lines``,
empty ones dropped (the node named ``non-empty``), split into words, counted per word
through the repartition ``by-word`` in memory, each count sent to ``describe-counts``
(the node named ``counts-out``); the other nodes' names are generated. ``timed_app``
is the same app stamping its counts as Kafka Streams does (``timestamps="latest"``).

    kasper app describe dsl_app_module:app --app-dir tests/integration
"""

from __future__ import annotations

from kasper_py.app import App
from kasper_py.dsl import Builder, Timestamps


def word_count(name: str, timestamps: Timestamps) -> App:
    builder = Builder(name, stores="memory", timestamps=timestamps)
    (builder.stream("describe-lines")
        .filter(lambda _key, line: bool(line), name="non-empty")
        .flat_map_values(str.split)
        .group_by(lambda _key, word: word, name="by-word")
        .count("counts")
        .to_stream()
        .to("describe-counts", name="counts-out"))
    return builder.build()


app = word_count("dsl-describe", "record")
timed_app = word_count("dsl-describe-timed", "latest")
