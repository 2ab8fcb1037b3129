"""``python -m kasper_py.stream ...``, and the file to give ``spark-submit`` (it runs
this file as a script, with kasper_py shipped through ``--py-files``)."""

import sys

from kasper_py.stream import main

if __name__ == "__main__":
    sys.exit(main())
