"""A standalone Spark cluster on this machine: one master and one worker, from pyspark's jars.

``local[2]`` runs the executors inside the driver's JVM; a job that works there can still fail
on a cluster - a jar the executors cannot load, a Python module their workers cannot import,
another interpreter. This cluster has the separation of a real one: the master and the worker
are JVMs of their own, the worker starts one executor JVM per application, and the executor
starts its own Python workers. Nothing is downloaded: pyspark's wheel ships ``bin/spark-class``
and every jar (it has no ``sbin/start-master.sh``, so the daemons are started directly).

Start-up (``LocalSparkCluster.start``):
1. four free loopback ports (master RPC, master web UI, worker RPC, worker web UI);
2. ``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker spark://...``,
   side by side - the worker retries until the master listens - bound to 127.0.0.1;
3. ready = the master's ``/json/`` lists the worker as ALIVE; ``<run dir>/state.json`` then
   names the master URL, the web UIs and the two pids.
A daemon that exits during start-up (a port taken in between) means new ports, not a crash.

``replaybroker spark up|status|down`` drives it like ``replaybroker kafka up|status|down``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from broker.dev.kafka_local import _pid_alive, _tail, _terminate, free_port
from broker.dev.maven import home, require_java
from broker.errors import LocalSparkError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0  # two JVMs starting at once on a loaded 2-core machine: 15-40 s
DAEMON_MEMORY = "256m"  # heap of the master and of the worker daemon (not of executors)


def default_run_dir() -> Path:
    return home() / "run" / "spark"


def spark_home() -> Path:
    """The pyspark package directory: it is a Spark distribution (bin/, jars/)."""
    try:
        import pyspark
    except ImportError as exc:
        raise LocalSparkError("pyspark is not installed (the `spark` extra)") from exc
    return Path(pyspark.__file__).parent


@dataclass(frozen=True)
class SparkClusterState:
    """What a running cluster leaves in ``<run dir>/state.json``."""

    master_url: str  # spark://127.0.0.1:<port>
    webui_url: str  # the master's web UI; /json/ is its state
    worker_webui_url: str
    master_pid: int
    worker_pid: int
    worker_cores: int
    worker_memory: str
    work_dir: str  # the worker's: one directory per application, executor stdout/stderr
    run_dir: str
    spark_version: str
    started_at: float


def master_json(webui_url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The master's state (workers, active and completed applications), None if it does not
    answer."""
    try:
        with urllib.request.urlopen(f"{webui_url}/json/", timeout=timeout_s) as response:
            return dict(json.load(response))
    except (OSError, urllib.error.URLError, ValueError):
        return None


def read_state(run_dir: Path) -> SparkClusterState | None:
    path = Path(run_dir) / "state.json"
    if not path.exists():
        return None
    try:
        return SparkClusterState(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def running_cluster(run_dir: Path) -> SparkClusterState | None:
    """The state of the cluster of ``run_dir`` if both daemons are alive and the master answers."""
    state = read_state(run_dir)
    if state is None or not (_pid_alive(state.master_pid) and _pid_alive(state.worker_pid)):
        return None
    return state if master_json(state.webui_url) is not None else None


class LocalSparkCluster:
    """A master and one worker in ``run_dir`` (logs, the worker's work dir, ``state.json``).

    Use as a context manager in-process, or ``start(detach=True)`` to leave it running for
    ``replaybroker spark up``; ``stop`` works on either from the state file. The worker offers
    ``worker_cores`` cores and ``worker_memory`` to executors: an application asks for at most
    that (``spark.executor.memory`` is 1g unless set).
    """

    def __init__(
        self, run_dir: Path | str | None = None, *, worker_cores: int = 2, worker_memory: str = "2g"
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir else default_run_dir()
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.state: SparkClusterState | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        if self.state is None:
            raise LocalSparkError("the local Spark cluster is not running")
        return self.state.master_url

    def status(self) -> dict[str, Any] | None:
        """The master's ``/json/`` (None when it does not answer)."""
        state = self.state or read_state(self.run_dir)
        return None if state is None else master_json(state.webui_url)

    def start(self, *, detach: bool = False, attempts: int = 3) -> SparkClusterState:
        running = running_cluster(self.run_dir)
        if running is not None:
            self.state = running
            return running
        require_java()
        last: LocalSparkError | None = None
        for _ in range(attempts):
            try:
                self.state = self._start_once(detach=detach)
                return self.state
            except LocalSparkError as exc:
                last = exc
                log.warning("local Spark cluster failed to start (%s); retrying on new ports", exc)
        assert last is not None
        raise last

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",  # bind and advertise loopback, not the host's address
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_CONF_DIR=str(self.run_dir / "conf"),  # empty: nothing of a user's conf leaks in
        )
        # A driver's SPARK_MASTER or PYSPARK_* settings are not the daemons' business.
        for name in ("SPARK_MASTER", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS"):
            env.pop(name, None)
        return env

    def _spawn(self, args: list[str], log_name: str, detach: bool) -> subprocess.Popen[bytes]:
        out = open(self.run_dir / log_name, "ab")  # noqa: SIM115 - handed to the child
        try:
            # spark-class execs the JVM: the pid is the daemon's own.
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=detach,
            )
        finally:
            out.close()
        self._procs.append(proc)
        return proc

    def _start_once(self, *, detach: bool) -> SparkClusterState:
        import pyspark

        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        (self.run_dir / "conf").mkdir(parents=True)
        work_dir = self.run_dir / "work"
        work_dir.mkdir()
        ports: set[int] = set()
        while len(ports) < 4:
            ports.add(free_port())
        master_port, master_ui, worker_port, worker_ui = sorted(ports)
        master_url = f"spark://127.0.0.1:{master_port}"
        self._procs = []
        master = self._spawn(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(master_port), "--webui-port", str(master_ui)],
            "master.log", detach,
        )
        worker = self._spawn(
            ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
             "--port", str(worker_port), "--webui-port", str(worker_ui),
             "--cores", str(self.worker_cores), "--memory", self.worker_memory,
             "--work-dir", str(work_dir)],
            "worker.log", detach,
        )
        state = SparkClusterState(
            master_url=master_url,
            webui_url=f"http://127.0.0.1:{master_ui}",
            worker_webui_url=f"http://127.0.0.1:{worker_ui}",
            master_pid=master.pid,
            worker_pid=worker.pid,
            worker_cores=self.worker_cores,
            worker_memory=self.worker_memory,
            work_dir=str(work_dir),
            run_dir=str(self.run_dir),
            spark_version=pyspark.__version__,
            started_at=time.time(),
        )
        try:
            self._wait_ready(state, master, worker)
        except LocalSparkError:
            for proc in (worker, master):
                _terminate(proc.pid)
            raise
        (self.run_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
        log.info("local Spark %s master %s with one worker (%d cores, %s) ready (run dir %s)",
                 state.spark_version, master_url, self.worker_cores, self.worker_memory, self.run_dir)
        return state

    def _wait_ready(
        self, state: SparkClusterState, master: subprocess.Popen[bytes], worker: subprocess.Popen[bytes]
    ) -> None:
        """Ready = the master lists our worker as ALIVE (the worker registered)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in (("master", master), ("worker", worker)):
                if proc.poll() is not None:
                    tail = _tail(self.run_dir / f"{name}.log")
                    raise LocalSparkError(
                        f"the Spark {name} exited with code {proc.returncode} during start-up; "
                        f"last log lines:\n{tail}"
                    )
            status = master_json(state.webui_url)
            if status is not None and any(
                w.get("state") == "ALIVE" and w.get("webuiaddress") == state.worker_webui_url
                for w in status.get("workers", ())
            ):
                return
            time.sleep(0.5)
        tail = _tail(self.run_dir / "worker.log")
        raise LocalSparkError(
            f"no worker registered with {state.master_url} within {READY_TIMEOUT_S:.0f}s; "
            f"last worker log lines:\n{tail}"
        )

    def stop(self) -> bool:
        """Stop the worker (it kills its executors) and then the master; True when one ran."""
        state = self.state or read_state(self.run_dir)
        if state is None:
            return False
        stopped = [_terminate(pid) for pid in (state.worker_pid, state.master_pid)]
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "state.json").unlink()
        self.state = None
        return any(stopped)

    def __enter__(self) -> LocalSparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def describe(state: SparkClusterState) -> str:
    return (
        f"Spark {state.spark_version} master {state.master_url} (web UI {state.webui_url}), "
        f"one worker with {state.worker_cores} cores and {state.worker_memory} "
        f"(pids {state.master_pid} {state.worker_pid}, run dir {state.run_dir})"
    )


def main_up(run_dir: Path | None = None, *, cores: int = 2, memory: str = "2g") -> int:
    """``replaybroker spark up``: start detached, or report the running cluster; prints the
    master URL on stdout (``--master $(replaybroker spark up)``)."""
    cluster = LocalSparkCluster(run_dir, worker_cores=cores, worker_memory=memory)
    existing = running_cluster(cluster.run_dir)
    if existing is not None:
        print(f"already running: {describe(existing)}", file=sys.stderr)
        print(existing.master_url)
        return 0
    started = time.monotonic()
    state = cluster.start(detach=True)
    print(f"started in {time.monotonic() - started:.1f}s: {describe(state)}", file=sys.stderr)
    print(state.master_url)
    return 0


def main_status(run_dir: Path | None = None) -> int:
    cluster = LocalSparkCluster(run_dir)
    state = running_cluster(cluster.run_dir)
    if state is None:
        print(f"not running (run dir {cluster.run_dir})")
        return 1
    status = master_json(state.webui_url) or {}
    apps = [a.get("name") for a in status.get("activeapps", ())]
    print(f"running: {describe(state)}; alive workers {status.get('aliveworkers', 0)}, "
          f"active applications {apps or 'none'}")
    return 0
