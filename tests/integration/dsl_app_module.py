"""A small streams-DSL app for `kasper app describe`: lines of ``describe-lines``,
empty ones dropped (the node named ``non-empty``), split into words, counted per word
through the repartition ``by-word`` in memory, each count sent to ``describe-counts``
(the node named ``counts-out``); the other nodes' names are generated.

    kasper app describe dsl_app_module:app --app-dir tests/integration
"""

from __future__ import annotations

from kasper_py.dsl import Builder

builder = Builder("dsl-describe", stores="memory")
(builder.stream("describe-lines")
    .filter(lambda _key, line: bool(line), name="non-empty")
    .flat_map_values(str.split)
    .group_by(lambda _key, word: word, name="by-word")
    .count("counts")
    .to_stream()
    .to("describe-counts", name="counts-out"))
app = builder.build()
