"""Spark as the stack gets it: the pyspark wheel (a SPARK_HOME with ``bin/spark-class``
and ``jars/``) and the jars that let it read and write Kafka: spark-sql-kafka and its
runtime deps. The standalone cluster's processes are components in ``_components``.

The connector's version follows ``pyspark.__version__``; jars that pyspark already ships
(slf4j, compression codecs, Spark itself ...) are left out so no class exists twice on
Spark's classpath.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from kasper_py.stack._errors import StackError
from kasper_py.stack._install import is_resolved, resolve_jars, template
from kasper_py.stack._settings import Settings

# Maven Central mirrors have been seen without spark-token-provider-kafka for some Spark
# patch releases (4.1.3 among them). An earlier patch release of the same 4.1 line stands
# in: spark-sql-kafka calls only its KafkaConfigUpdater, KafkaTokenUtil and
# KafkaRedactionUtil, which patch releases keep compatible; the delegation-token paths
# (Kerberos clusters) are the only ones that could notice the difference.
TOKEN_PROVIDER_FALLBACK = "4.1.1"

# "zstd-jni-1.5.7-6.jar" -> "zstd-jni": the version starts at the first "-<digit>".
_ARTIFACT_ID = re.compile(r"^(?P<artifact>.+?)-\d[^/]*\.jar$")


def spark_home() -> tuple[Path, str]:
    """The installed pyspark wheel's directory (a complete SPARK_HOME) and its version."""
    try:
        import pyspark  # noqa: PLC0415 - optional extra
    except ImportError:
        raise StackError("Spark needs pyspark: pip install 'kasper-py[spark]'") from None
    return Path(pyspark.__file__).parent, str(pyspark.__version__)


def spark_jars(stack_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Resolve (once) and list the connector jars to add to pyspark's ``spark.jars``."""
    home, version = spark_home()
    wheel_jars = home / "jars"
    lib_dir = Settings.load(stack_dir).lib_dir("spark", version)  # both poms: one folder
    exclude = [f"-DexcludeArtifactIds={','.join(sorted(_artifact_ids(wheel_jars)))}"]
    exact, fallback = _pom(version, version), _pom(version, TOKEN_PROVIDER_FALLBACK)
    if is_resolved(fallback, lib_dir, exclude):  # the exact one failed before: don't retry
        return [str(jar) for jar in resolve_jars(fallback, lib_dir, exclude)]
    try:
        jars = resolve_jars(exact, lib_dir, exclude)
    except StackError as exact_failure:
        reason = [line for line in str(exact_failure).splitlines() if "Could not" in line]
        print(f"spark-jars: using spark-token-provider-kafka {TOKEN_PROVIDER_FALLBACK}, as "
              f"{version} could not be resolved: {(reason or ['?'])[0].strip()}",
              file=sys.stderr)
        jars = resolve_jars(fallback, lib_dir, exclude)
    return [str(jar) for jar in jars]


def _pom(spark_version: str, token_provider_version: str) -> str:
    return (template("spark-pom.xml")
            .replace("@SPARK_VERSION@", spark_version)
            .replace("@TOKEN_PROVIDER_VERSION@", token_provider_version))


def _artifact_ids(jars_dir: Path) -> set[str]:
    """Maven artifact ids of the jars in ``jars_dir`` (from their file names)."""
    ids = set()
    for jar in jars_dir.glob("*.jar"):
        match = _ARTIFACT_ID.match(jar.name)
        if match:
            ids.add(match["artifact"])
    return ids
