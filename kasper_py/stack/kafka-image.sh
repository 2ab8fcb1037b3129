#!/bin/sh
# Entry point of kasper_py's locally built Kafka image (kasper_py/stack/_images.py).
# Configured the way the official apache/kafka image is: every KAFKA_* variable but
# KAFKA_HEAP_OPTS and KAFKA_OPTS becomes a server property (KAFKA_LOG_DIRS -> log.dirs;
# "__" stands for "_", "___" for "-"), CLUSTER_ID names the cluster formatted at first start.
set -e
props=/opt/kafka/server.properties
: > "$props"
env | grep '^KAFKA_' | grep -v -e '^KAFKA_HEAP_OPTS=' -e '^KAFKA_OPTS=' |
while IFS='=' read -r name value; do
  key=$(echo "${name#KAFKA_}" | tr 'A-Z' 'a-z' |
        sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
  echo "$key=$value" >> "$props"
done
grep -q '^log.dirs=' "$props" || echo "log.dirs=/tmp/kraft-combined-logs" >> "$props"
classpath='/opt/kafka/libs/*'
logging="-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties"
java -Xmx256m "$logging" -cp "$classpath" kafka.tools.StorageTool format \
  --cluster-id="${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" --config "$props" --ignore-formatted
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g} $KAFKA_OPTS -Djava.awt.headless=true "$logging" \
  -cp "$classpath" kafka.Kafka "$props"
