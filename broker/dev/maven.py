"""Jars from Maven Central, resolved once into the local Maven repository (development only).

The embedded Kafka (``org.apache.kafka:kafka_2.13`` + ``kafka-tools`` + a log4j2 slf4j
binding), Spark's Kafka connector (``spark-sql-kafka-0-10_2.13:<pyspark version>``) and
Delta Lake (``delta-spark_2.13:<delta-spark version>``, when the ``delta-spark`` package is
installed) are resolved by ``mvn dependency:build-classpath``; each classpath is cached in
``<home>/maven/<name>.classpath`` and reused while every jar on it still exists. Services
never resolve anything: ``spark_jobs.session`` only reads the cached classpaths.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from broker.errors import LocalKafkaError

log = logging.getLogger(__name__)

# Newest first; the first one Maven resolves wins. REPLAYBROKER_KAFKA_VERSION pins one.
KAFKA_VERSIONS = ("4.3.1", "4.2.0", "4.1.1")
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.17"
MAVEN_TIMEOUT_S = 900


def home() -> Path:
    """Cache and state directory: ``$REPLAYBROKER_HOME`` or ``~/.cache/replaybroker``."""
    root = os.environ.get("REPLAYBROKER_HOME") or Path.home() / ".cache" / "replaybroker"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _require(tool: str, how: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LocalKafkaError(f"no `{tool}` on PATH: {how}")
    return path


def require_java() -> str:
    return _require(
        "java", "the embedded Kafka needs a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)"
    )


def _pom(coordinates: Sequence[tuple[str, str, str]]) -> str:
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in coordinates
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>replaybroker.local</groupId><artifactId>resolve</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )


# Some poms (Spark's) declare extra repositories that may be unreachable; route every
# repository to Maven Central unless the user has Maven settings of their own.
MAVEN_SETTINGS = """<settings><mirrors><mirror><id>central-for-all</id><mirrorOf>*</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""


def _maven_settings_args() -> list[str]:
    explicit = os.environ.get("REPLAYBROKER_MAVEN_SETTINGS")
    if explicit:
        return ["-s", explicit]
    if (Path.home() / ".m2" / "settings.xml").exists():
        return []
    path = home() / "maven" / "settings.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MAVEN_SETTINGS)
    return ["-s", str(path)]


def resolve_classpath(name: str, coordinates: Sequence[tuple[str, str, str]]) -> list[str]:
    """Resolve ``coordinates`` (group, artifact, version) and their runtime closure with Maven.

    Cached per ``name``; a cache whose jars vanished is resolved again.
    """
    cache = home() / "maven" / f"{name}.classpath"
    if cache.exists():
        jars = [j for j in cache.read_text().strip().split(os.pathsep) if j]
        if jars and all(Path(j).exists() for j in jars):
            return jars
    mvn = _require("mvn", "jars are resolved with Maven (Debian: apt-get install maven)")
    work = home() / "maven" / name
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_pom(coordinates))
    out = work / "classpath.txt"
    cmd = [mvn, "-q", "-B", *_maven_settings_args(), "dependency:build-classpath"]
    if os.environ.get("REPLAYBROKER_MAVEN_REPO"):  # another local repository (e.g. a cold one)
        cmd.append(f"-Dmaven.repo.local={os.environ['REPLAYBROKER_MAVEN_REPO']}")
    cmd.append(f"-Dmdep.outputFile={out}")
    log.info("resolving %s with Maven", ", ".join(":".join(c) for c in coordinates))
    try:
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LocalKafkaError(f"Maven timed out resolving {name}") from exc
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        artifacts = ", ".join(":".join(c) for c in coordinates)
        raise LocalKafkaError(f"Maven could not resolve {artifacts}:\n" + "\n".join(tail))
    cache.write_text(out.read_text().strip())
    return [j for j in out.read_text().strip().split(os.pathsep) if j]


def kafka_coordinates(version: str) -> list[tuple[str, str, str]]:
    return [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.kafka", "kafka-tools", version),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
    ]


def kafka_classpath() -> tuple[str, list[str]]:
    """(Kafka version, jars): the newest version of KAFKA_VERSIONS that resolves."""
    pinned = os.environ.get("REPLAYBROKER_KAFKA_VERSION")
    versions = (pinned,) if pinned else KAFKA_VERSIONS
    errors = []
    for version in versions:
        try:
            return version, resolve_classpath(f"kafka-{version}", kafka_coordinates(version))
        except LocalKafkaError as exc:
            errors.append(str(exc))
    raise LocalKafkaError("no Kafka version could be resolved:\n" + "\n\n".join(errors))


def spark_kafka_connector_jars(pyspark_version: str | None = None) -> list[str]:
    """Jars of ``spark-sql-kafka-0-10_2.13:<pyspark version>`` and its non-Spark dependencies.

    Resolved into the local Maven repository so Spark loads them with ``spark.jars`` and no
    network at run time. Spark's own jars (scope ``provided``) are not on the list.
    """
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    coordinates = [("org.apache.spark", "spark-sql-kafka-0-10_2.13", pyspark_version)]
    return resolve_classpath(f"spark-sql-kafka-{pyspark_version}", coordinates)


DELTA_PACKAGE = "delta-spark"  # the PyPI package; its version is the jars' version


def installed_delta_version() -> str | None:
    """The installed ``delta-spark`` (the ``spark`` extra pins the release built on the pinned
    pyspark), or None without it."""
    from importlib import metadata

    try:
        return metadata.version(DELTA_PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def delta_jars(delta_version: str | None = None) -> list[str]:
    """Jars of ``io.delta:delta-spark_2.13:<version>`` (``delta-storage`` and what Spark may
    lack), the version of the installed Python package unless given: the Python API
    (``delta.tables``) and the jars must be one release."""
    version = delta_version or installed_delta_version()
    if version is None:
        raise LocalKafkaError(f"no `{DELTA_PACKAGE}` installed: it comes with the `spark` extra")
    return resolve_classpath(f"delta-spark-{version}", [("io.delta", "delta-spark_2.13", version)])
