"""The documentation site's build-time code: the mkdocs hooks (``hooks.py``), the
reference pages generated from the code (``reference.py``) and the code blocks of the
pages, found and checked by ``tests/unit/test_docs_blocks.py`` (``blocks.py``)."""
