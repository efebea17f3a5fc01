#!/bin/sh
# Fill in the ports, format the KRaft storage once (a fresh cluster id unless KAFKA_CLUSTER_ID),
# run the broker in the foreground. KAFKA_EXTRA_PROPERTIES (lines of key=value) go last and win.
set -eu
: "${KAFKA_PORT:=9092}" "${KAFKA_CONTROLLER_PORT:=9093}" "${KAFKA_HOST:=127.0.0.1}" "${KAFKA_HEAP:=768m}"
conf=/var/lib/kafka/server.properties
sed -e "s/@PORT@/$KAFKA_PORT/g" -e "s/@CONTROLLER_PORT@/$KAFKA_CONTROLLER_PORT/g" -e "s/@HOST@/$KAFKA_HOST/g" \
  /opt/kafka/server.properties.in > "$conf"
printf '%s\n' "${KAFKA_EXTRA_PROPERTIES:-}" >> "$conf"
set -f  # the classpath wildcard is for java, not the shell
java="java -Xmx$KAFKA_HEAP -Xms128m -XX:+UseG1GC -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -cp /opt/kafka/libs/*"
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  id=${KAFKA_CLUSTER_ID:-$(tr -d - < /proc/sys/kernel/random/uuid | cut -c1-22)}
  $java kafka.tools.StorageTool format --standalone -t "$id" -c "$conf"
fi
exec $java kafka.Kafka "$conf"
