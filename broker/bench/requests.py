"""The requests a system's clients make of the broker, counted by the broker itself.

The embedded broker is a JVM: its JMX agent is started locally (``jcmd <pid>
ManagementAgent.start_local``: no port, no change to the broker's command line) and Kafka's
own ``org.apache.kafka.tools.JmxTool`` (on the broker's classpath) samples, every
``INTERVAL_MS``, the counters that every request updates:

- ``kafka.network:type=RequestMetrics,name=RequestBytes,request=<API>``: a histogram per API
  (``Count`` = requests, ``Mean`` = request bytes);
- ``kafka.server:type=BrokerTopicMetrics,...[,topic=<t>]``: records and bytes produced,
  record bytes fetched, produce and fetch requests per topic.

Counters are cumulative: the value at a window's edge is interpolated between the samples
around it, so nothing runs in the clients' processes (their hot paths are the deployed ones)
and nothing waits at the edges. The probe runs only on a broker the bench started for
itself: a given cluster counts other clients' requests too.
"""

from __future__ import annotations

import bisect
import csv
import re
import subprocess
import threading
import time
from collections import defaultdict
from typing import Any

INTERVAL_MS = 200
_BEANS = ("kafka.network:type=RequestMetrics,name=RequestBytes,*", "kafka.server:type=BrokerTopicMetrics,*")
# Requests of the broker to itself (its controller, replication) or of nobody in a run
_SELF = {"BrokerHeartbeat", "BrokerRegistration", "FetchFollower", "Fetch", "Vote", "BeginQuorumEpoch",
         "EndQuorumEpoch", "FetchSnapshot", "AlterPartition", "AssignReplicasToDirs", "ControllerRegistration",
         "Envelope", "UpdateRaftVoter", "AllocateProducerIds"}
_REQUEST = re.compile(r"name=RequestBytes,request=([A-Za-z]+):(Count|Mean)$")
_TOPIC = re.compile(r"type=BrokerTopicMetrics,name=([A-Za-z]+)(?:,topic=([^:,]+))?:Count$")
_agents: dict[int, str] = {}


class ProbeError(RuntimeError):
    """The broker's metrics cannot be read (no JDK tools, not a JVM of this user...)."""


def jmx_url(pid: int) -> str:
    """The local JMX connector of JVM ``pid``, started if it was not."""
    if pid in _agents:
        return _agents[pid]
    try:
        subprocess.run(["jcmd", str(pid), "ManagementAgent.start_local"], capture_output=True, text=True,
                       timeout=30, check=True)
        counters = subprocess.run(["jcmd", str(pid), "PerfCounter.print"], capture_output=True, text=True,
                                  timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProbeError(f"jcmd on the broker ({pid}): {exc}") from exc
    match = re.search(r'^sun\.management\.JMXConnectorServer\.address="(.+)"$', counters, re.M)
    if match is None:
        raise ProbeError(f"the broker ({pid}) has no local JMX connector")
    _agents[pid] = match.group(1)
    return _agents[pid]


class Probe:
    """A JmxTool sampling the broker until ``stop``; ``at(t)`` = the counters at wall time t."""

    def __init__(self, pid: int) -> None:
        from broker.dev.maven import kafka_classpath, require_java

        _, jars = kafka_classpath()
        args = [require_java(), "-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", ":".join(jars),
                "org.apache.kafka.tools.JmxTool", "--jmx-url", jmx_url(pid), "--attributes", "Count,Mean",
                "--reporting-interval", str(INTERVAL_MS)]
        for bean in _BEANS:
            args += ["--object-name", bean]
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._columns: list[str] = []
        self._times: list[float] = []
        self._rows: list[list[float]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="bench-jmx", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for row in csv.reader(self._proc.stdout):
            if not row:
                continue
            if row[0] == "time":
                self._columns = row[1:]
                continue
            if not self._columns or len(row) != len(self._columns) + 1 or not row[0].isdigit():
                continue  # "Trying to connect...", a partial line
            values = [float(v) if v not in ("", "null") else 0.0 for v in row[1:]]
            with self._lock:
                self._times.append(int(row[0]) / 1000)
                self._rows.append(values)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._times:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProbeError("JmxTool gave no sample of the broker's metrics")
            time.sleep(0.05)

    def at(self, t: float, timeout: float = 5.0) -> dict[str, float]:
        """Every counter at wall time ``t`` (linear between the samples around it)."""
        deadline = time.monotonic() + timeout
        while (not self._times or self._times[-1] < t) and time.monotonic() < deadline and self._proc.poll() is None:
            time.sleep(0.05)
        with self._lock:
            times, rows = list(self._times), list(self._rows)
        if not times:
            raise ProbeError("no sample of the broker's metrics")
        i = bisect.bisect_left(times, t)
        if i == 0 or i == len(times):
            row = rows[min(i, len(rows) - 1)]
            return dict(zip(self._columns, row, strict=True))
        (t0, a), (t1, b) = (times[i - 1], rows[i - 1]), (times[i], rows[i])
        f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        return {c: x + f * (y - x) for c, x, y in zip(self._columns, a, b, strict=True)}

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def start(pid: int | None) -> Probe | None:
    """A probe of the bench's own broker ``pid``, or None when it cannot run here."""
    if pid is None:
        return None
    from broker.errors import LocalKafkaError

    try:
        probe = Probe(pid)
        probe.wait_ready()
    except (ProbeError, OSError, LocalKafkaError):  # no JDK tools, no Kafka classpath here
        return None
    return probe


def compare(before: dict[str, float], after: dict[str, float], completed: float,
            namespace: str | None) -> dict[str, Any]:
    """The requests between two samples per 1 000 ``completed`` records: by API, and per
    topic role (``bench.cost.role_of``); records and bytes per produce request, record bytes
    per consumer fetch response."""
    from broker.bench.cost import role_of

    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    per_k = 1000.0 / max(completed, 1e-9)
    requests: dict[str, float] = {}
    request_bytes: dict[str, float] = {}
    topics: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    total: dict[str, float] = {}
    for column, d in delta.items():
        m = _REQUEST.search(column)
        if m is not None:
            api, attr = m.groups()
            if attr == "Count" and d > 0.5 and api not in _SELF:
                requests[api] = d
                # the histogram's mean is exact: bytes = count x mean, before and after
                mean = f"{column[:-len(':Count')]}:Mean"
                request_bytes[api] = after.get(mean, 0.0) * after[column] - before.get(mean, 0.0) * before.get(column, 0.0)
            continue
        m = _TOPIC.search(column)
        if m is not None and d > 0:
            metric, topic = m.groups()
            if topic is None:
                total[metric] = d
            else:
                topics[role_of(topic, namespace)][metric] += d
    produce = requests.get("Produce", 0.0)
    fetch = requests.get("FetchConsumer", 0.0)
    records_in = total.get("MessagesInPerSec", 0.0)
    return {
        "completed": round(completed),
        "requests_per_1k": {api: round(n * per_k, 2) for api, n in sorted(requests.items(), key=lambda kv: -kv[1])},
        "total_per_1k": round(sum(requests.values()) * per_k, 2),
        "produce": {"records_per_request": round(records_in / produce, 2) if produce else None,
                    "bytes_per_request": round(request_bytes.get("Produce", 0.0) / produce, 1) if produce else None},
        "fetch": {"bytes_per_response": round(total.get("BytesOutPerSec", 0.0) / fetch, 1) if fetch else None},
        "topics": {role: {"produce_requests_per_1k": round(v.get("TotalProduceRequestsPerSec", 0.0) * per_k, 2),
                          "fetch_requests_per_1k": round(v.get("TotalFetchRequestsPerSec", 0.0) * per_k, 2),
                          "records_in_per_record": round(v.get("MessagesInPerSec", 0.0) / max(completed, 1e-9), 3),
                          "bytes_in_per_record": round(v.get("BytesInPerSec", 0.0) / max(completed, 1e-9), 1),
                          "bytes_out_per_record": round(v.get("BytesOutPerSec", 0.0) / max(completed, 1e-9), 1)}
                   for role, v in sorted(topics.items())},
    }
