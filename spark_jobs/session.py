"""The one place a SparkSession is built, so jobs and tests configure Spark the same way.

Every session carries the spark-sql-kafka connector from the start: jars cannot be added to a
running JVM, and one session serves a whole process (``getOrCreate``), so a session built
without them could never read Kafka later. The jars come from the classpath that ``replaybroker setup`` resolved into the local Maven
repository (``$REPLAYBROKER_SPARK_JARS``, else ``<home>/maven/spark-sql-kafka-<version>.classpath``),
so nothing is downloaded when Spark starts. Without either, the connector is named by its
Maven coordinates (``spark.jars.packages``) and Spark fetches it, as on any cluster.

Delta Lake's jars (``OriginDeltaSink``) come the same way, for the same reason, when the
``delta-spark`` package is installed (the ``spark`` extra): the classpath ``replaybroker
setup`` resolved for its version (``<home>/maven/delta-spark-<version>.classpath``), else its
coordinates; the session then also carries Delta's SQL extension and catalog.

On a cluster (a master that is not ``local``) the executors are other JVMs, and their Python
workers other processes, maybe on other machines:

- the connector jars go by ``spark.jars`` - local paths the driver serves to the executors;
- this project's packages (``broker``, ``spark_jobs``, ``schemas``) go as one zip
  (``package_zip``, ``SparkContext.addPyFile``) that every Python worker puts on its path: a
  UDF or a function of ``spark_jobs`` pickled by reference imports them there;
- the Python workers run ``$PYSPARK_PYTHON`` as the driver saw it; it defaults to this
  interpreter for ``local`` and for a master on a loopback address (``replaybroker spark up``:
  the executors are on this machine), and is the cluster's business anywhere else.

Under ``spark-submit`` the launcher has chosen all of that (``--master``, ``--jars`` or
``--packages``, ``--py-files``, ``spark.pyspark.python``): the session then adds only the
defaults below, and Delta's extension and catalog when the launcher was given Delta's jars.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"

# Small and quiet: the jobs shuffle little, and a console progress bar or UI helps no one here.
_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}

CONNECTOR_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
DELTA_ARTIFACT = "io.delta:delta-spark_2.13"
# MERGE (and Delta's SQL) needs the extension; the catalog makes spark_catalog Delta-aware.
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def _home() -> Path:
    return Path(os.environ.get("REPLAYBROKER_HOME") or Path.home() / ".cache" / "replaybroker")


def resolved_connector_jars(pyspark_version: str | None = None) -> list[str] | None:
    """The connector's resolved jars, or None when ``replaybroker setup`` has not run."""
    explicit = os.environ.get("REPLAYBROKER_SPARK_JARS")
    if explicit:
        return [j for j in explicit.split(os.pathsep) if j]
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    cache = _home() / "maven" / f"spark-sql-kafka-{pyspark_version}.classpath"
    if not cache.exists():
        return None
    jars = [j for j in cache.read_text().strip().split(os.pathsep) if j]
    return jars if jars and all(Path(j).exists() for j in jars) else None


def delta_version() -> str | None:
    """The installed ``delta-spark`` package's version (None without it)."""
    from importlib import metadata

    try:
        return metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        return None


def resolved_delta_jars() -> list[str] | None:
    """Delta's resolved jars for the installed ``delta-spark``, or None (not installed, or
    ``replaybroker setup`` has not resolved them)."""
    version = delta_version()
    if version is None:
        return None
    cache = _home() / "maven" / f"delta-spark-{version}.classpath"
    if not cache.exists():
        return None
    jars = [j for j in cache.read_text().strip().split(os.pathsep) if j]
    return jars if jars and all(Path(j).exists() for j in jars) else None


_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def _artifact(jar: str) -> str:
    name = Path(jar).name
    match = _VERSIONED_JAR.match(name)
    return match.group("artifact") if match else name


def _spark_home_jars() -> set[str]:
    import pyspark

    jars_dir = Path(pyspark.__file__).parent / "jars"
    return {_artifact(str(j)) for j in jars_dir.glob("*.jar")}


def _unshipped(resolved: Iterable[str]) -> list[str]:
    """``resolved`` minus the artifacts Spark already ships (scala-library, hadoop client,
    slf4j, lz4, snappy, antlr4-runtime ...): two versions of one class on the classpath is a
    bug waiting for the wrong class loader, so only what Spark lacks is added."""
    shipped = _spark_home_jars()
    return [j for j in resolved if _artifact(j) not in shipped]


def connector_jars(extra: Iterable[str] = ()) -> list[str] | None:
    """The connector's jars (and Delta's, when resolved) that Spark lacks, then ``extra``.
    None when the connector has not been resolved locally."""
    resolved = resolved_connector_jars()
    if resolved is None:
        return None
    return [*_unshipped([*resolved, *(resolved_delta_jars() or [])]), *extra]


PACKAGES = ("broker", "spark_jobs", "schemas")  # what a Python worker of these jobs imports
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _launched_by_spark_submit() -> bool:
    """spark-submit (and the pyspark shell) start the JVM first and hand its gateway to Python."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _submitted_with_delta() -> bool:
    """Under spark-submit: whether its ``--jars`` or ``--packages`` carry Delta Lake, and no
    ``spark.sql.extensions`` of the user's is set (the launcher passes its settings to the JVM
    as system properties, which a new ``SparkConf`` reads)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    submitted = SparkConf()
    shipped = ",".join(submitted.get(key, "") or "" for key in ("spark.jars", "spark.jars.packages"))
    return "delta-spark" in shipped and not submitted.contains("spark.sql.extensions")


def _loopback_master(master: str) -> bool:
    """A standalone master on this machine (``spark://127.0.0.1:7077``)."""
    if not master.startswith("spark://"):
        return False
    return all(urlparse(f"spark://{hp}").hostname in LOOPBACK_HOSTS for hp in master[8:].split(","))


def package_zip(directory: str | Path | None = None) -> Path:
    """``replaybroker.zip`` of the packages in ``PACKAGES``, as imported here (sources and
    ``schemas/*.avsc``, no bytecode), written into ``directory`` - by default a temporary one
    removed when this process exits. ``spark-submit --py-files`` takes the same zip."""
    import broker

    root = Path(broker.__file__).resolve().parent.parent
    if directory is None:
        directory = tempfile.mkdtemp(prefix="rb-pyfiles-")
        atexit.register(shutil.rmtree, directory, True)
    Path(directory).mkdir(parents=True, exist_ok=True)
    target = Path(directory) / "replaybroker.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    archive.write(path, str(path.relative_to(root)))
    return target


def build_spark_session(
    app_name: str = "replaybroker",
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    jars: Iterable[str] = (),
) -> SparkSession:
    """A SparkSession, shared with any already running in this process (``getOrCreate``).

    ``master`` defaults to ``$SPARK_MASTER``, else ``local[2]`` (under spark-submit: its
    ``--master``); ``conf`` overrides the defaults above; ``jars`` are added to the Kafka
    connector's and Delta's jars (``spark.jars``). JVM-level settings (driver memory, jars) only take
    effect when this call starts the JVM. On a cluster master the project's packages are
    shipped to the executors (module docstring).
    """
    submitted = _launched_by_spark_submit()
    master = master or os.environ.get("SPARK_MASTER") or (None if submitted else DEFAULT_MASTER)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = dict(_DEFAULT_CONF)
    if master is not None and (master.startswith("local") or _loopback_master(master)):
        # Python workers (UDFs) run this interpreter, not whatever `python3` is on PATH; on a
        # remote cluster the executors' own Python is the cluster's business. PySpark 4 takes
        # the workers' interpreter from $PYSPARK_PYTHON when the context starts (the conf key
        # is read only by spark-submit): without it a UDF runs outside this virtualenv.
        settings["spark.pyspark.python"] = sys.executable
        if not submitted:
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and _loopback_master(master):
        # Executors on this machine call the driver back on loopback, whatever the host's
        # name resolves to.
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    delta = delta_version()
    if delta is not None and (not submitted or _submitted_with_delta()):
        settings.update(DELTA_CONF)
    settings.update(conf or {})
    if not submitted:  # spark-submit resolved --jars / --packages itself
        local = connector_jars(jars)
        if local is None:
            import pyspark

            packages = [f"{CONNECTOR_ARTIFACT}:{pyspark.__version__}"]
            if delta is not None:
                packages.append(f"{DELTA_ARTIFACT}:{delta}")
            settings["spark.jars.packages"] = ",".join(packages)
            local = list(jars)
        elif delta is not None and resolved_delta_jars() is None:
            settings["spark.jars.packages"] = f"{DELTA_ARTIFACT}:{delta}"
        settings["spark.jars"] = ",".join(
            [*local, *filter(None, settings.get("spark.jars", "").split(","))]
        )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _ship_packages(spark)
    return spark


def _ship_packages(spark: SparkSession) -> None:
    """``addPyFile`` of ``package_zip()`` once per context, on a cluster master, unless
    spark-submit ``--py-files`` shipped something already."""
    sc = spark.sparkContext
    if (sc.master or "local").startswith("local") or sc.getConf().get("spark.submit.pyFiles"):
        return
    if getattr(sc, "_replaybroker_zip", None) is None:
        zip_path = package_zip()
        sc.addPyFile(str(zip_path))
        sc._replaybroker_zip = zip_path  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- where code runs


def _process_parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _jvm_ancestor() -> tuple[int | None, str | None]:
    """(pid, main class) of the nearest JVM above this process (Linux ``/proc``): the
    executor (``...executor.CoarseGrainedExecutorBackend``) on a cluster, the driver's JVM
    (``...deploy.SparkSubmit``) in ``local`` mode."""
    pid = _process_parent(os.getpid())
    while pid is not None and pid > 1:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            break
        if args and Path(args[0]).name == "java":
            main = next((a for a in args[1:] if a.startswith("org.apache.spark.")), None)
            return pid, main
        pid = _process_parent(pid)
    return None, None


def _describe_python_worker(_: Any) -> dict[str, Any]:
    # Pickled by reference: the worker imported this module (and its package) to run it.
    jvm_pid, jvm_main = _jvm_ancestor()
    return {
        "pid": os.getpid(),
        "python": sys.executable,
        "spark_jobs": str(Path(__file__).parent),
        "jvm_pid": jvm_pid,
        "jvm_main": jvm_main,
    }


def python_workers(spark: SparkSession, tasks: int = 2) -> list[dict[str, Any]]:
    """Where this project's code runs on the executors: ``tasks`` tasks, each a Python worker
    that imports ``spark_jobs`` and reports its pid, interpreter, where ``spark_jobs`` came
    from (the shipped zip on a cluster) and the JVM that started it."""
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    return rdd.map(_describe_python_worker).collect()


def driver_jvm_pid(spark: SparkSession) -> int:
    jvm: Any = spark.sparkContext._jvm
    return int(jvm.java.lang.ProcessHandle.current().pid())
