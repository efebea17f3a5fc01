"""``replaybroker bench``: every figure of docs/design.md §9 beside its baseline, in one run.

Sections, in this order (the Kafka-free one first, while the broker is idle):

1. ``fold``       - LedgerTable.fold vs a plain dict fold, 10^4 .. 10^7 pending entries;
2. ``console``    - the operator console's pages over 10^5 dead letters, the Overview at P=1000
   (bench.console; Kafka-free too);
3. ``restore``    - changelog restore rate;
4. ``throughput`` - pipeline vs raw produce->consume vs a KIP-932 share group, and the
   skeleton (the pipeline's unavoidable Kafka calls alone, bench.hops) vs raw;
5. ``latency``    - completion latency at 50 % of the measured pipeline throughput, vs raw;
6. ``replay``     - replay latency after an explicit failure and after a timeout; fixed vs
   adaptive timeouts under a latency shift (detection of a dropped record, spurious replays);
7. ``takeover``   - kill -9 of one of two ackers: detection and restore, with and without standby;
8. ``redrive``    - ``dlq redrive --rate`` of many dead letters: achieved rate, and live traffic's
   latency meanwhile against the same traffic without it;
9. ``spark``      - the order job with and without ``Acking`` (records/s, jobs per micro-batch),
   and a sink's micro-batch time against a small and a large table (one Spark session);
10. ``scale``      - P=1000 against P=16, 1, 2 and 4 ackers, kill -9 of one of 4 with and
   without standbys, Zipf keys, idle cost, a task joining (bench.scale): on a 3-broker
   cluster of its own, whatever ``--bootstrap`` says; only with ``--only scale``.

Kafka: ``--bootstrap``, else ``KAFKA_BOOTSTRAP_SERVERS``, else an embedded Kafka started in
a temporary run directory for this run and stopped after it. Outputs go to
``bench/results/<stamp>.{json,md}`` and ``<stamp>-*.png`` (``--results-dir`` elsewhere).
A section that fails is reported (its figures unavailable with the error) and the command
exits 1; a figure that cannot be measured here (e.g. no share groups on the broker) is
unavailable with the reason, which is not an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.bench import report
from broker.bench.figures import (
    DEFAULT_SECTIONS,
    FIGURE_KEYS,
    TAKEOVER_SIZES,
    Figures,
    default_results_dir,
)
from broker.bench.hops import Env, run_hop
from broker.bench.pipeline import REQUEST_SYSTEMS
from broker.bench.progress import Progress


@dataclass(frozen=True)
class BenchPlan:
    """How big each section is: ``--quick`` (a few minutes), ``--smoke`` (its harness's test) or full."""

    quick: bool
    throughput_s: float
    warm_s: float
    latency_s: float
    replay_records: int
    replay_rate: float
    replay_timeout_ms: int
    restore_entries: int
    adaptive_records: int = 2_000
    takeover_sizes: tuple[int, ...] = (100_000,)
    # The embedded broker allows 6 s (group.consumer.min.session.timeout.ms); quick uses it.
    takeover_session_timeout_ms: int = 10_000
    # At most this much traffic through the broker before anything is measured, until its JIT
    # compiler is quiet: a fresh one spends about a minute of CPU compiling on this 2-core
    # machine, on whichever runs come first (bench.pipeline.warm_broker).
    warm_broker_s: float = 48.0
    # spark: at most this long warming Spark's JVM up first, until its JIT compiler is quiet
    # (spark_jobs.measure.compare_acking: right after one round it still compiled on ~0.9 of a
    # core, and the acked batch, with more planning per batch, paid more of it); then orders in
    # the topic, per micro-batch, rounds (the first is left out; quick: 4 kept, 28 full batches
    # a variant - with 8 the median moved by +-0.1 run to run, with 16 still by +-0.08; the
    # batches read to a partition's end are no longer held ~1 s, which paid for these), the rows
    # already in the small and the large sink, and the sink batches timed per size. An odd
    # number of rounds: the order alternates, so the rounds kept run each variant first equally
    # often (with 2, the plain query always ran second, on a JVM warmer by one acked query).
    spark_warm_s: float = 100.0
    spark_records: int = 24_000
    spark_batch_records: int = 3_000
    spark_rounds: int = 5
    # The same comparison with larger micro-batches (a topic of its own): the acking's cost is
    # partly per batch, so the ratio depends on the batch size (docs/benchmarks.md).
    spark_large_records: int = 50_000
    spark_large_batch_records: int = 10_000
    spark_sink_sizes: tuple[int, int] = (1_000, 100_000)
    spark_sink_batches: int = 2
    # OriginDeltaSink(optimize_every=n) against never, over 2n batches (bench.spark: optimize.*)
    spark_optimize_every: int = 4
    # dead letters redriven at redrive_rate under live traffic (bench.redrive), each phase window_s
    redrive_dead: int = 10_000
    redrive_rate: float = 500.0
    redrive_window_s: float = 15.0
    # bench.console: dead letters in the index, ledger partitions of the Overview, fetches a page
    console_dead: int = 100_000
    console_partitions: int = 1000
    console_repeat: int = 20

    @classmethod
    def make(cls, quick: bool, replay_timeout_ms: int | None = None, *, smoke: bool = False) -> BenchPlan:
        """``smoke``: ``--quick`` with the Spark section, the broker's warm-up and the dead letters
        smaller still - the harness's own test (tests/integration/test_bench_smoke.py), whose
        figures only have to exist; never a measurement."""
        if smoke:
            return dataclasses.replace(
                cls.make(True, replay_timeout_ms), warm_broker_s=15.0,
                spark_warm_s=20.0, spark_records=6_000, spark_batch_records=1_500, spark_rounds=3,
                spark_large_records=10_000, spark_large_batch_records=5_000, spark_sink_sizes=(1_000, 10_000),
                spark_optimize_every=2, redrive_dead=500, redrive_window_s=3.0, console_dead=2_000, console_repeat=3,
            )
        if quick:
            return cls(True, 4.0, 1.0, 5.0, 200, 100.0, replay_timeout_ms or 2_000, 100_000, 4_400, (100_000,),
                       6_000, 48.0, redrive_dead=1_000, redrive_window_s=5.0,
                       console_dead=10_000, console_repeat=5)
        return cls(False, 20.0, 3.0, 20.0, 2_000, 200.0, replay_timeout_ms or 10_000, 1_000_000, 4_400,
                   TAKEOVER_SIZES, 10_000, 120.0, spark_warm_s=180.0, spark_records=50_000, spark_batch_records=5_000,
                   spark_rounds=5,
                   spark_large_records=80_000, spark_large_batch_records=20_000,
                   spark_sink_sizes=(10_000, 1_000_000), spark_sink_batches=4, spark_optimize_every=8)

    def weights(self) -> dict[str, float]:
        """Expected seconds per section (drives the progress bar)."""
        if self.quick:
            return {"kafka": 6, "fold": 8, "restore": 4, "throughput": 90, "latency": 16, "replay": 50, "takeover": 40,
                    "redrive": 25, "spark": 330, "scale": 240,
                    "console": 3}
        return {"kafka": 6, "fold": 90, "restore": 20, "throughput": 130, "latency": 60, "replay": 100, "takeover": 150,
                "redrive": 70, "spark": 600, "scale": 600,
                "console": 10}


@dataclass
class Options:
    quick: bool = False
    smoke: bool = False  # BenchPlan.make: quick, smaller still (the harness's own test)
    json: bool = False
    bootstrap: str | None = None
    results_dir: Path = field(default_factory=default_results_dir)
    partitions: int = 4
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    profile: bool = False
    skip_share: bool = False
    commit_interval_ms: int = 100
    replay_timeout_ms: int | None = None
    progress: bool = True
    # count the broker's requests (bench.requests) on a given local broker too, whose counts
    # then include every other client's (None: only on the bench's own embedded broker)
    count_requests: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    profile_dir: Path | None = None  # set by run() with --profile


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


@contextlib.contextmanager
def _kafka(options: Options, progress: Progress) -> Iterator[tuple[str, str, int | None]]:
    """(bootstrap, description, the broker's pid when it is a local embedded one): the given
    cluster, or an embedded one started for this run."""
    from broker.dev.kafka_local import LocalKafka

    explicit = options.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if explicit:
        progress.start("kafka", f"using {explicit}")
        yield explicit, f"{explicit} (given)", local_listener_pid(explicit)
        return
    progress.start("kafka", "starting an embedded Kafka for this run")
    jfr = options.profile_dir / "kafka.jfr" if options.profile_dir is not None else None
    with tempfile.TemporaryDirectory(prefix="replaybroker-bench-kafka-") as run_dir:
        kafka = LocalKafka(run_dir, jfr=jfr)
        state = kafka.start()
        try:
            yield state.bootstrap, f"embedded {state.kafka_version} at {state.bootstrap}", state.pid
        finally:
            kafka.stop()


def local_log_dir(pid: int | None) -> Path | None:
    """The log directory of a local broker process: ``log.dirs`` of the properties file on its
    command line (one directory), so the bench can read the bytes appended on disk."""
    if pid is None:
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for arg in args:
        if arg.endswith(b".properties") and Path(arg.decode()).is_file():
            for line in Path(arg.decode()).read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() in ("log.dirs", "log.dir") and "," not in value:
                    return Path(value.strip())
    return None


def local_listener_pid(bootstrap: str) -> int | None:
    """The pid of the local process listening on the first bootstrap address, when it is on
    this host (Linux /proc) - so a given local broker's CPU is reported too."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]", "::1", "0.0.0.0") or not port.isdigit():
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == int(port):
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


def _delete_topics(env: Env) -> None:
    if not env.created_topics:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(env.settings.client_config())
    futures = admin.delete_topics(sorted(set(env.created_topics)), operation_timeout=30)
    for future in futures.values():
        with contextlib.suppress(Exception):
            future.result(timeout=30)


def _section_keys(section: str) -> list[str]:
    # The latency runs measure the cost and check the count; the throughput runs the CPU.
    # The fold section also measures the key partitions (bench.keys), Kafka-free too.
    extra = {"latency": {"cost", "check"}, "throughput": {"cpu", "requests"}, "fold": {"keys"}}.get(section, set())
    prefixes = {section, *extra}
    return [k for k in FIGURE_KEYS if k.split(".", 1)[0] in prefixes]


def run(options: Options) -> dict[str, Any]:
    """Run the sections; write the JSON, Markdown and PNGs; return the result object."""
    from broker.settings import KafkaSettings

    plan = BenchPlan.make(options.quick or options.smoke, options.replay_timeout_ms, smoke=options.smoke)
    weights = {k: v for k, v in plan.weights().items() if k == "kafka" or k in options.sections}
    progress = Progress(weights, enabled=options.progress)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    started = time.monotonic()
    figures = Figures()
    errors: dict[str, str] = {}
    details: dict[str, Any] = {}
    series: dict[str, Any] = {}
    meta: dict[str, Any] = {
        "stamp": stamp,
        "mode": "smoke" if options.smoke else "quick" if plan.quick else "full",
        "partitions": options.partitions,
        "commit_interval_ms": options.commit_interval_ms,
        "cpus": os.cpu_count(),
        "loadavg_start": _loadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "plan": plan.__dict__,
    }
    with contextlib.suppress(ImportError):
        import confluent_kafka
        import numpy

        meta["confluent_kafka"] = confluent_kafka.version()[0]
        meta["librdkafka"] = confluent_kafka.libversion()[0]
        meta["numpy"] = numpy.__version__
    options.results_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"replaybroker-bench-{stamp}-"))
    meta["workdir"] = str(workdir)
    profile_dir = None
    if options.profile:
        profile_dir = options.results_dir / f"{stamp}-profiles"
        profile_dir.mkdir(parents=True, exist_ok=True)
        meta["profiles"] = str(profile_dir)
        options.profile_dir = profile_dir

    def stage(section: str) -> Any:
        progress.start(section)
        return lambda fraction, detail="": progress.update(fraction, detail)

    def guarded(section: str, body: Any) -> None:
        if section not in options.sections:
            figures.unavailable(_section_keys(section), f"section {section} not selected (--only)")
            return
        try:
            body(stage(section))
        except Exception as exc:  # noqa: BLE001 - one failed section must not hide the others
            errors[section] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            figures.unavailable(_section_keys(section), f"error in section {section}: {type(exc).__name__}: "
                                + (str(exc).splitlines() or [""])[0][:300])

    # 1. fold needs no Kafka: run it before the broker is busy
    def fold(update: Any) -> None:
        from broker.bench import keys
        from broker.bench.fold import measure

        series["fold"] = measure(figures, quick=plan.quick, progress=update)
        details["fold"] = {k: v for k, v in series["fold"].items()}
        keys.measure(figures, quick=plan.quick)

    guarded("fold", fold)

    def console(update: Any) -> None:
        from broker.bench import console as bench_console

        measured = bench_console.measure(plan.console_dead, plan.console_partitions, plan.console_repeat,
                                         index_dir=workdir)
        bench_console.record(figures, measured)
        details["console"] = measured

    guarded("console", console)

    kafka_sections = [s for s in options.sections if s not in ("fold", "console", "scale")]
    if kafka_sections:
        try:
            with _kafka(options, progress) as (bootstrap, kafka_desc, kafka_pid):
                meta["kafka"] = kafka_desc
                own = not (options.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
                count = own if options.count_requests is None else options.count_requests
                env = Env(bootstrap, KafkaSettings.from_env(bootstrap), options.partitions, workdir,
                          profile_dir=profile_dir, commit_interval_ms=options.commit_interval_ms,
                          kafka_pid=kafka_pid, log_dir=local_log_dir(kafka_pid),
                          request_systems=REQUEST_SYSTEMS if count and kafka_pid is not None else ())
                try:
                    _kafka_sections(env, plan, options, figures, details, series, guarded)
                finally:
                    with contextlib.suppress(Exception):
                        _delete_topics(env)
        except Exception as exc:  # noqa: BLE001 - e.g. the embedded Kafka does not start
            errors["kafka"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    # scale starts a cluster of its own: after the embedded broker has stopped
    def scale(update: Any) -> None:
        from broker.bench.scale import measure_scale

        details["scale"] = {}
        measure_scale(workdir, figures, details["scale"], quick=plan.quick,
                      commit_interval_ms=options.commit_interval_ms, progress=update)

    guarded("scale", scale)
    meta.setdefault("kafka", "not used")
    if "kafka" in errors:
        figures.unavailable(FIGURE_KEYS, f"not measured: {errors['kafka'].splitlines()[0][:300]}")

    meta["loadavg_end"] = _loadavg()
    if profile_dir is not None:
        from broker.bench.procs import render_profiles

        progress.start("report", "rendering the profiles")
        render_profiles(profile_dir)
    meta["seconds"] = round(time.monotonic() - started, 1)
    load1 = float(meta["loadavg_start"].split()[0]) if meta["loadavg_start"] != "?" else 0.0
    if load1 > 0.5 * (os.cpu_count() or 1):
        meta["noisy"] = (f"The machine was busy (load average {meta['loadavg_start']} on {meta['cpus']} CPUs "
                         "at the start): timings are noisy; compare ratios, re-run on a quiet machine for figures.")
    result: dict[str, Any] = {
        "meta": meta,
        "figures": figures.complete(),
        "errors": {k: v.splitlines()[0] for k, v in errors.items()},
        "details": _jsonable(details),
    }
    base = options.results_dir / stamp
    files: dict[str, Any] = {"json": str(base.with_suffix(".json")), "markdown": str(base.with_suffix(".md")),
                             "plots": []}
    result["files"] = files
    progress.start("report", "writing results")
    try:
        files["plots"] = report.plots(result, series, options.results_dir, stamp)
    except Exception as exc:  # noqa: BLE001 - the figures are still worth writing
        errors["plots"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        result["errors"]["plots"] = errors["plots"].splitlines()[0]
    Path(files["markdown"]).write_text(report.markdown(result))
    report.write_json(result, Path(files["json"]))
    if errors:
        (options.results_dir / f"{stamp}-errors.txt").write_text("\n\n".join(f"[{k}]\n{v}" for k, v in errors.items()))
        result["files"]["errors"] = str(options.results_dir / f"{stamp}-errors.txt")
    progress.close(f"{len(result['figures'])} figures in {meta['seconds']:.0f}s -> {files['markdown']}")
    if not errors:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _kafka_sections(env: Env, plan: BenchPlan, options: Options, figures: Figures, details: dict[str, Any],
                    series: dict[str, Any], guarded: Any) -> None:
    from broker.bench.adaptive import measure_adaptive
    from broker.bench.pipeline import (
        compiler_cpu,
        measure_fixed_latency,
        measure_latency,
        measure_throughput,
    )
    from broker.bench.replay import measure_replay
    from broker.bench.restore import measure_restore
    from broker.bench.spark import measure_spark
    from broker.bench.takeover import measure_takeover

    def restore(update: Any) -> None:
        details["restore"] = measure_restore(env, figures, entries=plan.restore_entries, progress=update)

    def throughput(update: Any) -> None:
        runs = measure_throughput(env, figures, duration=plan.throughput_s, warm=plan.warm_s, progress=update,
                                  skip_share=options.skip_share, warm_broker_s=plan.warm_broker_s)
        series["throughput"] = runs
        details["throughput"] = {k: {kk: vv for kk, vv in v.items() if kk != "recv_rel"} for k, v in runs.items()}

    def latency(update: Any) -> None:
        peak = figures.value("throughput.pipeline_rps")
        if peak is None:  # throughput not run (or failed): calibrate on a short pipeline run
            update(0.0, "calibrating the peak")
            peak = run_hop(env, "pipeline", duration=plan.throughput_s, warm=plan.warm_s).throughput()
        lat = measure_latency(env, figures, rate=max(peak * 0.5, 10.0), duration=plan.latency_s, warm=plan.warm_s,
                              progress=update)
        series["latency"] = lat
        details["latency"] = {k: v for k, v in lat.items() if not hasattr(v, "shape")}
        update(0.9, "at the fixed load")
        details["latency"]["fixed"] = measure_fixed_latency(env, figures, duration=plan.latency_s, warm=plan.warm_s)

    def replay(update: Any) -> None:
        def part(start: float, share: float) -> Callable[[float, str], None]:
            return lambda f, detail: update(start + share * f, detail)

        rep = measure_replay(env, figures, timeout_ms=plan.replay_timeout_ms, records=plan.replay_records,
                             rate=plan.replay_rate, progress=part(0.0, 0.25))
        series["replay"] = rep
        details["replay"] = {k: v for k, v in rep.items() if not hasattr(v, "shape")}
        details["replay"]["adaptive"] = measure_adaptive(
            env, figures, records=plan.adaptive_records, progress=part(0.25, 0.75))

    def takeover(update: Any) -> None:
        details["takeover"] = measure_takeover(env, figures, sizes=plan.takeover_sizes,
                                               session_timeout_ms=plan.takeover_session_timeout_ms, progress=update)

    def redrive(update: Any) -> None:
        from broker.bench.redrive import measure_redrive

        measured = measure_redrive(env.bootstrap, dead=plan.redrive_dead, rate=plan.redrive_rate,
                                   window_s=plan.redrive_window_s)
        for key, value in measured.items():
            figures.set(key, value)

    def spark(update: Any) -> None:
        compiler_before, began = compiler_cpu(env), time.monotonic()
        details["spark"] = measure_spark(env, figures, warm_s=plan.spark_warm_s, records=plan.spark_records,
                                         batch_records=plan.spark_batch_records, rounds=plan.spark_rounds,
                                         large=(plan.spark_large_records, plan.spark_large_batch_records),
                                         sink_sizes=plan.spark_sink_sizes, sink_batches=plan.spark_sink_batches,
                                         optimize_every=plan.spark_optimize_every, progress=update)
        compiler_after = compiler_cpu(env)
        if compiler_before is not None and compiler_after is not None:
            # How busy the broker's JIT compiler was while Spark was measured (share of a core):
            # with --only spark the broker may be fresh (measured: 0.03 fresh, 0.01 warmed).
            details["spark"]["broker_compiler_share"] = round(
                (compiler_after - compiler_before) / max(time.monotonic() - began, 1e-3), 4)

    guarded("restore", restore)
    guarded("throughput", throughput)
    guarded("latency", latency)
    guarded("replay", replay)
    guarded("takeover", takeover)
    guarded("redrive", redrive)
    guarded("spark", spark)


def _jsonable(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                     default=lambda v: None))
