#!/bin/sh
# Entry point of kasper_py's locally built OpenSearch image (kasper_py/stack/_images.py):
# one node, its settings in /opt/opensearch/config/opensearch.yml, placed by
# OPENSEARCH_HOST, OPENSEARCH_HTTP_PORT and OPENSEARCH_TRANSPORT_PORT.
set -e
export OPENSEARCH_HOST="${OPENSEARCH_HOST:-127.0.0.1}"
export OPENSEARCH_HTTP_PORT="${OPENSEARCH_HTTP_PORT:-9200}"
export OPENSEARCH_TRANSPORT_PORT="${OPENSEARCH_TRANSPORT_PORT:-9300}"
home=/opt/opensearch
mkdir -p /var/lib/opensearch/data /var/lib/opensearch/logs
# shellcheck disable=SC2046,SC2086 - one JVM option a line
exec java $(cat "$home/jvm.options") $OPENSEARCH_JAVA_OPTS -Dopensearch.path.home="$home" \
  -Dopensearch.path.conf="$home/config" -Dopensearch.distribution.type=tar \
  -Dopensearch.bundled_jdk=false -cp "$home/lib/*" org.opensearch.bootstrap.OpenSearch "$@"
