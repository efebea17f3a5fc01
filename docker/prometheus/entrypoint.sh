#!/bin/sh
# Write the scrape configuration from ACKER_TARGETS and TASK_TARGETS (host:port, space
# separated; the job names are those docker/grafana's dashboard selects), then run Prometheus
# on 127.0.0.1:PROMETHEUS_PORT. docker/prometheus.yml is the same for a cluster of your own.
set -eu
: "${PROMETHEUS_PORT:=9090}" "${NAMESPACE:=demo}" "${SCRAPE_INTERVAL:=5s}"
targets() { printf '"%s",' $1 | sed 's/,$//'; }
cat > /tmp/prometheus.yml <<YAML
global:
  scrape_interval: $SCRAPE_INTERVAL
  evaluation_interval: $SCRAPE_INTERVAL
scrape_configs:
  - job_name: replaybroker-acker
    static_configs:
      - targets: [$(targets "${ACKER_TARGETS:-127.0.0.1:9464}")]
        labels: {namespace: $NAMESPACE}
  - job_name: replaybroker-task
    static_configs:
      - targets: [$(targets "${TASK_TARGETS:-127.0.0.1:9465}")]
        labels: {namespace: $NAMESPACE}
YAML
exec prometheus --config.file=/tmp/prometheus.yml --storage.tsdb.path=/tmp/prometheus \
  --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" "$@"
