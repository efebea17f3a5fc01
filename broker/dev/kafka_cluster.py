"""A local multi-node Kafka 4.x cluster (KRaft) from the same Maven-resolved jars as the
embedded broker: every node is broker and controller, the controllers form one quorum
(static voters), internal topics are replicated 3-fold with min.insync.replicas 2.

For tests and demos of broker failures: ``kill(i)`` is a kill -9 of node i, ``restart(i)``
brings the same node back on its data directory and ports. Sized for a 2-core machine: small
heaps, few threads per node.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.dev.kafka_local import (
    LOG4J2_PROPERTIES,
    READY_TIMEOUT_S,
    BrokerState,
    LocalKafka,
    _pid_alive,
    _port_open,
    _tail,
    free_port,
    read_state,
)
from broker.dev.maven import home, kafka_classpath, require_java
from broker.errors import LocalKafkaError

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0

NODE_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data_dir}
num.partitions=1
default.replication.factor={replication}
min.insync.replicas={min_insync}
auto.create.topics.enable=false
offsets.topic.replication.factor={replication}
offsets.topic.num.partitions=3
transaction.state.log.replication.factor={replication}
transaction.state.log.min.isr={min_insync}
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor={replication}
share.coordinator.state.topic.min.isr={min_insync}
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=6000
num.network.threads=2
num.io.threads=2
background.threads=2
num.replica.fetchers=1
log.cleaner.threads=1
log.cleaner.enable=true
log.cleaner.backoff.ms=200
log.cleaner.dedupe.buffer.size=8388608
replica.lag.time.max.ms=10000
log.retention.check.interval.ms=5000
log.segment.delete.delay.ms=1000
file.delete.delay.ms=1000
"""


def default_cluster_dir() -> Path:
    return home() / "run" / "kafka-cluster"


@dataclass(frozen=True)
class ClusterState:
    """What a running local cluster leaves in ``<run dir>/cluster.json``."""

    pids: list[int]
    ports: list[int]
    controller_ports: list[int]
    bootstrap: str
    run_dir: str
    kafka_version: str
    cluster_id: str
    started_at: float


def read_cluster_state(run_dir: Path) -> ClusterState | None:
    path = Path(run_dir) / "cluster.json"
    if not path.exists():
        return None
    try:
        return ClusterState(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def running_cluster(run_dir: Path) -> ClusterState | None:
    state = read_cluster_state(run_dir)
    if state and any(_pid_alive(p) and _port_open(port) for p, port in zip(state.pids, state.ports, strict=True)):
        return state
    return None


def recorded_kafka(run_dir: Path) -> ClusterState | BrokerState | None:
    """What ``kafka up`` recorded in ``run_dir``, either kind: a cluster's ``cluster.json``
    (``--brokers N``) or one node's ``state.json`` (also ``--sasl``); None: neither."""
    return read_cluster_state(run_dir) or read_state(run_dir)


def stop_recorded(run_dir: Path) -> bool:
    """Stop the Kafka that ``kafka up`` started in ``run_dir``, a cluster or one node, as its
    state file says; True when one was running."""
    state = recorded_kafka(run_dir)
    if isinstance(state, ClusterState):
        return LocalCluster(len(state.pids), run_dir).stop()
    return LocalKafka(run_dir).stop()


class LocalCluster:
    """``nodes`` combined broker/controller nodes in ``run_dir`` (node i in ``node-<i>``)."""

    def __init__(
        self, nodes: int = 3, run_dir: Path | str | None = None, *, heap: str = "384m",
        properties: Mapping[str, object] | None = None,
    ) -> None:
        """``properties``: broker settings over ``NODE_PROPERTIES`` (the last of a key wins)."""
        if nodes < 1:
            raise LocalKafkaError("a cluster needs at least one node")
        self.nodes = nodes
        self.run_dir = Path(run_dir) if run_dir else default_cluster_dir()
        self.heap = heap
        self.properties = dict(properties or {})
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.state: ClusterState | None = None
        self._jvm: list[str] = []
        self._detach = False

    @property
    def bootstrap(self) -> str:
        if self.state is None:
            raise LocalKafkaError("the local cluster is not running")
        return self.state.bootstrap

    @property
    def replication(self) -> int:
        return min(3, self.nodes)

    @property
    def min_insync(self) -> int:
        return 2 if self.nodes >= 3 else 1

    def node_dir(self, node: int) -> Path:
        return self.run_dir / f"node-{node}"

    def start(self, *, detach: bool = False) -> ClusterState:
        running = running_cluster(self.run_dir)
        if running is not None:
            self.state = running
            return running
        java = require_java()
        version, jars = kafka_classpath()
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        ports: list[int] = []
        while len(ports) < 2 * self.nodes:
            p = free_port()
            if p not in ports:
                ports.append(p)
        broker_ports, controller_ports = ports[: self.nodes], ports[self.nodes :]
        voters = ",".join(f"{i + 1}@127.0.0.1:{controller_ports[i]}" for i in range(self.nodes))
        cluster_id = uuid.uuid4().hex[:22]
        classpath = os.pathsep.join(jars)
        for i in range(self.nodes):
            d = self.node_dir(i)
            (d / "data").mkdir(parents=True)
            (d / "server.properties").write_text(NODE_PROPERTIES.format(
                node_id=i + 1, voters=voters, port=broker_ports[i], controller_port=controller_ports[i],
                data_dir=d / "data", replication=self.replication, min_insync=self.min_insync,
            ) + "".join(f"{key}={value}\n" for key, value in self.properties.items()))
            (d / "log4j2.properties").write_text(LOG4J2_PROPERTIES.format(log_file=d / "server.log", level="INFO"))
        self._jvm = [java, f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                     "-XX:CICompilerCount=1", "-cp", classpath]
        for i in range(self.nodes):
            d = self.node_dir(i)
            fmt = subprocess.run(
                [*self._jvm, f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}", "kafka.tools.StorageTool",
                 "format", "-t", cluster_id, "-c", str(d / "server.properties")],
                capture_output=True, text=True, check=False,
            )
            if fmt.returncode != 0:
                raise LocalKafkaError(f"formatting node {i} failed:\n{fmt.stdout}{fmt.stderr}")
        self._detach = detach
        for i in range(self.nodes):
            self._launch(i)
        self.state = ClusterState(
            pids=[self.procs[i].pid for i in range(self.nodes)],
            ports=broker_ports,
            controller_ports=controller_ports,
            bootstrap=",".join(f"127.0.0.1:{p}" for p in broker_ports),
            run_dir=str(self.run_dir),
            kafka_version=version,
            cluster_id=cluster_id,
            started_at=time.time(),
        )
        try:
            self.wait_ready(self.nodes)
        except LocalKafkaError:
            self.stop()
            raise
        self._save()
        log.info("local Kafka %s cluster of %d nodes ready at %s (run dir %s)", version, self.nodes,
                 self.state.bootstrap, self.run_dir)
        return self.state

    def _save(self) -> None:
        assert self.state is not None
        (self.run_dir / "cluster.json").write_text(json.dumps(asdict(self.state), indent=2))

    def _launch(self, i: int) -> None:
        d = self.node_dir(i)
        out = open(d / "kafka.out", "ab")  # noqa: SIM115 - handed to the child
        self.procs[i] = subprocess.Popen(
            [*self._jvm, f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}", "kafka.Kafka",
             str(d / "server.properties")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=self._detach,
        )
        out.close()

    def wait_ready(self, brokers: int, timeout_s: float = READY_TIMEOUT_S * 2) -> None:
        """Until ``brokers`` brokers are registered and a topic replicated to all of them can
        be created and written with acks=all."""
        from confluent_kafka import KafkaError, KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from broker.kafka_log import client_logging

        assert self.state is not None
        deadline = time.monotonic() + timeout_s
        conf = {"bootstrap.servers": self.state.bootstrap, "socket.timeout.ms": 2000, **client_logging()}
        admin = AdminClient(conf)
        name = f"__replaybroker_ready_{uuid.uuid4().hex[:8]}"
        created = False
        producer: Producer | None = None
        try:
            while True:
                for i, proc in self.procs.items():
                    if proc.poll() is not None:
                        tail = _tail(self.node_dir(i) / "server.log")
                        raise LocalKafkaError(f"node {i} exited with code {proc.returncode}; last log lines:\n{tail}")
                try:
                    if len(admin.list_topics(timeout=2).brokers) >= brokers:
                        if not created:
                            # Created once: a topic that exists already (an earlier attempt whose
                            # write timed out) is not a reason to wait forever.
                            try:
                                admin.create_topics([NewTopic(name, 1, min(brokers, self.replication))],
                                                    operation_timeout=5)[name].result(timeout=10)
                            except KafkaException as exc:
                                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                                    raise
                            created = True
                        if producer is None:
                            producer = Producer({**conf, "acks": "all", "message.timeout.ms": 10_000})
                        producer.produce(name, b"ready")
                        if producer.flush(12) == 0:
                            admin.delete_topics([name], operation_timeout=5)
                            return
                except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
                    pass
                if time.monotonic() > deadline:
                    raise LocalKafkaError(f"the local cluster did not become ready within {timeout_s:.0f}s")
                time.sleep(0.5)
        finally:
            if producer is not None:
                producer.purge()
                producer.flush(0)

    def kill(self, i: int) -> None:
        """SIGKILL node i (a crash); its data and ports stay for ``restart(i)``."""
        proc = self.procs.get(i)
        if proc is None:
            raise LocalKafkaError(f"node {i} was not started by this object")
        proc.kill()
        proc.wait(30)

    def restart(self, i: int) -> None:
        """Start node i again on its data directory and ports, and wait until it is back."""
        assert self.state is not None
        self._launch(i)
        pids = list(self.state.pids)
        pids[i] = self.procs[i].pid
        self.state = ClusterState(**{**asdict(self.state), "pids": pids})
        self._save()
        self.wait_ready(self.nodes)

    def stop(self) -> bool:
        state = self.state or read_cluster_state(self.run_dir)
        if state is None:
            return False
        # All at once: stopped one by one, the last nodes wait for a controller quorum that
        # is already gone. Whatever has not exited after STOP_WAIT_S is killed.
        alive = [pid for pid in state.pids if _pid_alive(pid)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and any(_pid_alive(pid) for pid in alive):
            for pid in alive:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        for pid in alive:
            if _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        stopped = bool(alive)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "cluster.json").unlink()
        self.state = None
        return stopped

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main_up(nodes: int, run_dir: Path | None = None) -> int:
    """``replaybroker kafka up --brokers N``: start detached, or report the running cluster."""
    cluster = LocalCluster(nodes, run_dir)
    existing = running_cluster(cluster.run_dir)
    if existing is not None:
        print(f"already running: Kafka {existing.kafka_version}, {len(existing.pids)} nodes "
              f"(run dir {existing.run_dir})", file=sys.stderr)
        print(existing.bootstrap)
        return 0
    started = time.monotonic()
    state = cluster.start(detach=True)
    print(f"started a Kafka {state.kafka_version} cluster of {nodes} nodes in {time.monotonic() - started:.1f}s "
          f"(pids {', '.join(map(str, state.pids))}, run dir {state.run_dir})", file=sys.stderr)
    print(state.bootstrap)
    return 0
