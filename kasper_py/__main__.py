"""``python -m kasper_py ...`` is the ``kasper`` command."""

from kasper_py.cli import main

raise SystemExit(main())
