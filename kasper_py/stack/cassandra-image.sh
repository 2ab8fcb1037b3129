#!/bin/sh
# `cassandra -f [-Dname=value...]` in kasper_py's locally built Cassandra image
# (kasper_py/stack/_images.py): one node in the foreground, its data in /var/lib/cassandra;
# -D options (cassandra.native_transport_port, cassandra.storage_port) reach the JVM;
# CASSANDRA_SEEDS and CASSANDRA_CLUSTER_NAME are written into cassandra.yaml, as the
# official image does.
set -e
config=/etc/cassandra/cassandra.yaml
if [ -n "$CASSANDRA_SEEDS" ]; then
  sed -i "s/- seeds: .*/- seeds: \"$CASSANDRA_SEEDS\"/" "$config"
fi
if [ -n "$CASSANDRA_CLUSTER_NAME" ]; then
  sed -i "s/^cluster_name: .*/cluster_name: '$CASSANDRA_CLUSTER_NAME'/" "$config"
fi
options=""
for argument in "$@"; do
  case "$argument" in
    -f) ;;
    -D*) options="$options $argument" ;;
    *) echo "cassandra: unknown argument $argument" >&2; exit 2 ;;
  esac
done
mkdir -p /var/lib/cassandra/triggers
# shellcheck disable=SC2046,SC2086 - one JVM option a line; -D options have no spaces
exec java $(cat /etc/cassandra/jvm.options) \
  -Dcassandra.config=file:///etc/cassandra/cassandra.yaml \
  -Dlogback.configurationFile=/etc/cassandra/logback.xml \
  -Dcassandra.logdir=/var/lib/cassandra -Dcassandra.storagedir=/var/lib/cassandra \
  -Dcassandra.triggers_dir=/var/lib/cassandra/triggers $options \
  -cp '/opt/cassandra/lib/*' org.apache.cassandra.service.CassandraDaemon
