"""An embedded single-node Kafka 4.x (KRaft, broker + controller) from Maven-resolved jars.

It is the default Kafka of the demo and the tests. Nothing is downloaded by hand: Maven
resolves ``org.apache.kafka:kafka_2.13`` (+ ``kafka-tools`` for the console clients and a
log4j2 slf4j binding) into the local Maven repository; the resolved classpath is cached in
``<home>/maven/kafka-<version>.classpath`` and reused while every jar on it still exists.

Start-up order:
1. resolve the classpath (Maven, once per machine);
2. write ``server.properties`` with two free loopback ports (bound to port 0, then released);
3. ``kafka.tools.StorageTool format --standalone`` with a fresh cluster id;
4. start ``kafka.Kafka`` and wait until an admin client can create a topic.
If the broker dies because a port was taken between steps 2 and 4, steps 2-4 run again with
new ports: a taken port means another port, not a crash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from broker.dev.maven import home, kafka_classpath, require_java
from broker.errors import LocalKafkaError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def default_run_dir() -> Path:
    return home() / "run" / "kafka"




# --------------------------------------------------------------------------- ports


def free_port() -> int:
    """A free loopback port: bind port 0 and let the kernel choose."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- broker

# Tuned for one node and for tests: single-partition internal topics, no rebalance delay,
# a log cleaner that compacts within seconds (topics still choose segment.ms and the dirty
# ratio themselves), share groups on, no topic auto-creation (a misspelt topic is an error).
SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data_dir}
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=6000
log.cleaner.enable=true
log.cleaner.backoff.ms=200
log.cleaner.min.compaction.lag.ms=0
log.cleaner.dedupe.buffer.size=16777216
log.retention.check.interval.ms=5000
log.segment.delete.delay.ms=1000
file.delete.delay.ms=1000
"""

LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = INFO
"""


@dataclass(frozen=True)
class BrokerState:
    """What a running embedded broker leaves in ``<run dir>/state.json``."""

    pid: int
    bootstrap: str
    port: int
    controller_port: int
    run_dir: str
    kafka_version: str
    cluster_id: str
    started_at: float


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def read_state(run_dir: Path) -> BrokerState | None:
    path = Path(run_dir) / "state.json"
    if not path.exists():
        return None
    try:
        return BrokerState(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def running_state(run_dir: Path) -> BrokerState | None:
    """The state of the broker of ``run_dir`` if its process is alive and its port answers."""
    state = read_state(run_dir)
    if state and _pid_alive(state.pid) and _port_open(state.port):
        return state
    return None


def wait_ready(bootstrap: str, exited: Callable[[], int | None], deadline: float) -> None:
    """Ready = an admin client created a topic (the controller and the broker both work).

    ``exited()`` is the broker's exit code once it died (None while it runs): a dead broker
    fails at once instead of at the deadline."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.kafka_log import client_logging

    port = int(bootstrap.rsplit(":", 1)[1])
    while not _port_open(port):  # before any client exists, so librdkafka logs no refusals
        if (code := exited()) is not None:
            raise LocalKafkaError(f"Kafka exited with code {code} during start-up")
        if time.monotonic() > deadline:
            raise LocalKafkaError(f"Kafka did not open port {port} within {READY_TIMEOUT_S:.0f}s")
        time.sleep(0.1)
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000, **client_logging()})
    while time.monotonic() < deadline:
        if (code := exited()) is not None:
            raise LocalKafkaError(f"Kafka exited with code {code} during start-up")
        # A new name per attempt: an attempt whose answer timed out may still have created
        # its topic, and "already exists" must not read as "not ready" until the deadline.
        name = f"__replaybroker_ready_{uuid.uuid4().hex[:8]}"
        try:
            admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=5)[name].result(timeout=5)
            admin.delete_topics([name], operation_timeout=5)
            return
        except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
            time.sleep(0.25)
    raise LocalKafkaError(f"Kafka did not become ready within {READY_TIMEOUT_S:.0f}s")


class LocalKafka:
    """One embedded broker in ``run_dir`` (data, logs, ``state.json``).

    Use as a context manager in-process, or ``start(detach=True)`` to leave it running for
    ``replaybroker kafka up``; ``stop`` works on either from the state file.
    """

    def __init__(self, run_dir: Path | str | None = None, *, heap: str = "768m",
                 jfr: Path | str | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir else default_run_dir()
        self.heap = heap
        # Java Flight Recorder: a recording of the broker's whole life ("profile" settings:
        # method samples every 10 ms, allocations, locks, GC), written when it stops
        self.jfr = Path(jfr).resolve() if jfr else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.state: BrokerState | None = None
        self._jvm: list[str] = []
        self._detach = False

    @property
    def bootstrap(self) -> str:
        if self.state is None:
            raise LocalKafkaError("the embedded Kafka is not running")
        return self.state.bootstrap

    def start(self, *, detach: bool = False, attempts: int = 3) -> BrokerState:
        running = running_state(self.run_dir)
        if running is not None:
            self.state = running
            return running
        require_java()
        version, jars = kafka_classpath()
        last: LocalKafkaError | None = None
        for _ in range(attempts):
            try:
                self.state = self._start_once(version, jars, detach=detach)
                return self.state
            except LocalKafkaError as exc:
                last = exc
                log.warning("embedded Kafka failed to start (%s); retrying on new ports", exc)
        assert last is not None
        raise last

    def _start_once(self, version: str, jars: list[str], *, detach: bool) -> BrokerState:
        java = require_java()
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        data_dir = self.run_dir / "data"
        data_dir.mkdir(parents=True)
        port, controller_port = free_port(), free_port()
        while controller_port == port:
            controller_port = free_port()
        props = self.run_dir / "server.properties"
        props.write_text(self._properties(port, controller_port, data_dir))
        log4j = self.run_dir / "log4j2.properties"
        log4j.write_text(
            LOG4J2_PROPERTIES.format(log_file=self.run_dir / "server.log", level="INFO")
        )
        classpath = os.pathsep.join(jars)
        jvm = [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC"]
        jvm += [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        cluster_id = uuid.uuid4().hex[:22]
        fmt = subprocess.run(
            [*jvm, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id, "-c", str(props)],
            capture_output=True,
            text=True,
            check=False,
        )
        if fmt.returncode != 0:
            raise LocalKafkaError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        self._jvm, self._detach = jvm, detach
        self._launch()
        assert self.proc is not None
        state = BrokerState(
            pid=self.proc.pid,
            bootstrap=f"127.0.0.1:{port}",
            port=port,
            controller_port=controller_port,
            run_dir=str(self.run_dir),
            kafka_version=version,
            cluster_id=cluster_id,
            started_at=time.time(),
        )
        self._wait_ready(state)
        (self.run_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
        log.info("embedded Kafka %s ready at %s (run dir %s)", version, state.bootstrap, self.run_dir)
        return state

    def _properties(self, port: int, controller_port: int, data_dir: Path) -> str:
        """``server.properties`` (a subclass may add listeners)."""
        return SERVER_PROPERTIES.format(port=port, controller_port=controller_port, data_dir=data_dir)

    def _launch(self) -> None:
        out = open(self.run_dir / "kafka.out", "ab")  # noqa: SIM115 - handed to the child
        recording = []
        if self.jfr is not None:
            self.jfr.parent.mkdir(parents=True, exist_ok=True)
            recording = [f"-XX:StartFlightRecording=filename={self.jfr},settings=profile,dumponexit=true"]
        self.proc = subprocess.Popen(
            [*self._jvm, *recording, "kafka.Kafka", str(self.run_dir / "server.properties")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=self._detach,
        )
        out.close()

    def _wait_ready(self, state: BrokerState) -> None:
        assert self.proc is not None
        try:
            wait_ready(state.bootstrap, self.proc.poll, time.monotonic() + READY_TIMEOUT_S)
        except LocalKafkaError as exc:
            _terminate(self.proc.pid)
            tail = _tail(self.run_dir / "server.log") or _tail(self.run_dir / "kafka.out")
            raise LocalKafkaError(f"{exc}; last log lines:\n{tail}") from exc

    def kill(self) -> None:
        """SIGKILL the broker this object started (a crash: no clean shutdown); its data and
        ports stay, so ``restart`` brings the same broker back."""
        if self.proc is None or self.state is None:
            raise LocalKafkaError("kill() needs a broker started by this object")
        self.proc.kill()
        self.proc.wait(30)

    def restart(self) -> BrokerState:
        """Start the broker again on its data directory and ports (after ``kill``)."""
        if self.state is None:
            raise LocalKafkaError("restart() needs a broker started by this object")
        self._launch()
        assert self.proc is not None
        self.state = replace(self.state, pid=self.proc.pid, started_at=time.time())
        self._wait_ready(self.state)
        (self.run_dir / "state.json").write_text(json.dumps(asdict(self.state), indent=2))
        return self.state

    def stop(self) -> bool:
        """Stop the broker of ``run_dir``; True when one was running."""
        state = self.state or read_state(self.run_dir)
        if state is None:
            return False
        stopped = _terminate(state.pid)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "state.json").unlink()
        self.state = None
        return stopped

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(pid: int) -> bool:
    """SIGTERM, wait up to STOP_TIMEOUT_S for a clean shutdown, then SIGKILL."""
    if not _pid_alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def demo_cluster(explicit: str | None) -> tuple[str, str]:
    """The cluster a demo or an example runs on, and where it came from: ``--bootstrap``,
    else ``KAFKA_BOOTSTRAP_SERVERS``, else the running embedded Kafka, else a new one (left
    running for later commands)."""
    if explicit:
        return explicit, "--bootstrap"
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"], "KAFKA_BOOTSTRAP_SERVERS"
    state = running_state(default_run_dir())
    if state is not None:
        return state.bootstrap, "the running embedded Kafka"
    print("starting the embedded Kafka (replaybroker kafka down stops it)", file=sys.stderr)
    return LocalKafka().start(detach=True).bootstrap, "the embedded Kafka, started now"


def main_up(run_dir: Path | None = None, *, jfr: str | None = None) -> int:
    """``replaybroker kafka up``: start detached, or report the running broker."""
    kafka = LocalKafka(run_dir, jfr=jfr)
    existing = running_state(kafka.run_dir)
    if existing is not None:
        print(
            f"already running: Kafka {existing.kafka_version} (pid {existing.pid}, "
            f"run dir {existing.run_dir})",
            file=sys.stderr,
        )
        print(existing.bootstrap)
        return 0
    started = time.monotonic()
    state = kafka.start(detach=True)
    print(
        f"started Kafka {state.kafka_version} in {time.monotonic() - started:.1f}s "
        f"(pid {state.pid}, run dir {state.run_dir})",
        file=sys.stderr,
    )
    print(state.bootstrap)
    return 0
