"""``python -m kasper_py.stack``: the stack command line (see ``kasper_py.stack.main``)."""

from kasper_py.stack import main

raise SystemExit(main())
