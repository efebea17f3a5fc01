"""Throughput (pipeline vs raw vs share group) and completion latency at 50 % of peak.

See ``bench.hops`` for how each system runs and what "complete" means for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from broker.bench.figures import FIGURE_KEYS, Figures
from broker.bench.hops import KAFKA, Env, HopRun, read_all, run_hop
from broker.bench.procs import BenchError

Progress = Callable[[float, str], None]

# the systems whose requests the bench counts (bench.requests) on its own broker
REQUEST_SYSTEMS = ("pipeline", "skeleton")


def _share_unavailable_reason(exc: BaseException) -> str:
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    hints = [line.strip() for line in text.splitlines() if any(
        word in line for word in ("UNSUPPORTED", "Unsupported", "not supported", "INVALID", "share", "Share"))]
    detail = f" ({hints[0][:200]})" if hints and hints[0] not in first else ""
    return f"share-group run failed: {first[:300]}{detail}"


def measure_throughput(env: Env, figures: Figures, *, duration: float, warm: float,
                       progress: Progress | None = None, skip_share: bool = False,
                       warm_broker_s: float = 0.0) -> dict[str, Any]:
    """Fill ``throughput.*`` and ``cpu.*``. Returns the runs' summaries for the report.

    Each system's completions are counted without an observer (``bench.completions``: the
    acker's committed counters, a worker's own count) in the window ``[start + warm, end]``
    of its send, and its CPU - every process and the broker's JVM - in the same window.

    First, unmeasured, ``warm_broker_s`` of pipeline traffic and half as much raw traffic: a
    fresh broker's JIT compiler takes most of a core for tens of seconds, which would weigh
    on whichever system runs first (seen: 100 µs of compiler CPU per pipeline record in a
    first run, 5 in a third). A broker in service is warm; so are the measured runs."""
    runs: dict[str, Any] = {}
    systems = ["raw", "share", "pipeline", "skeleton"]
    steps = len(systems) + (1 if warm_broker_s > 0 else 0)
    if warm_broker_s > 0:
        if progress:
            progress(0.0, "warming the broker")
        runs["warm_broker"] = warm_broker(env, warm_broker_s)
    offset = steps - len(systems)
    for i, system in enumerate(systems):
        step = (lambda f, i=i, s=system: progress((offset + i + f) / steps, s)) if progress else None
        if step:
            step(0.0)
        if system == "share" and skip_share:
            figures.unavailable(["throughput.share_rps", "cpu.share_us_per_record"], "skipped (--skip-share)")
            continue
        try:
            run = run_hop(env, system, duration=duration, warm=warm, on_progress=step,
                          warmup_timeout=45.0 if system == "share" else 90.0)
        except Exception as exc:
            if system != "share":
                raise
            # e.g. a broker without KIP-932 (Kafka < 4.1, or share groups disabled)
            figures.unavailable(["throughput.share_rps", "cpu.share_us_per_record"], _share_unavailable_reason(exc))
            runs[system] = {"error": str(exc)[:2000]}
            continue
        runs[system] = _summary(run)
        assert run.window is not None
        figures.set(f"throughput.{system}_rps", run.throughput(), sent=run.sent,
                    sent_rps=round(run.sent / max(run.t1 - run.t0, 1e-3), 1), completed=run.window.completed,
                    window_s=round(run.window.mark_seconds, 3), extended_s=run.window.extended_s)
        figures.set(f"cpu.{system}_us_per_record", run.cpu_us_per_record(),
                    unavailable="the broker is not a local process (its CPU unknown)" if env.kafka_pid is None
                    else "no completions counted in the window",
                    cores=round(sum(run.window.cpu_s.values()) / max(run.window.seconds, 1e-3), 2))
        if system == "share" and run.done.get("share") and run.done["share"].get("errors"):  # type: ignore[union-attr]
            runs[system]["errors"] = run.done["share"]["errors"]  # type: ignore[index]
    figures.ratio("throughput.pipeline_vs_raw", "throughput.pipeline_rps", "throughput.raw_rps")
    figures.ratio("throughput.pipeline_vs_share", "throughput.pipeline_rps", "throughput.share_rps")
    figures.ratio("throughput.skeleton_vs_raw", "throughput.skeleton_rps", "throughput.raw_rps")
    figures.ratio("throughput.pipeline_vs_skeleton", "throughput.pipeline_rps", "throughput.skeleton_rps")
    figures.ratio("cpu.pipeline_vs_share", "cpu.share_us_per_record", "cpu.pipeline_us_per_record")
    record_requests(figures, env, runs)
    return runs


def record_requests(figures: Figures, env: Env, runs: dict[str, Any]) -> None:
    """``cost.broker_vs_skeleton`` (the broker's CPU per completed record in the throughput
    window, pipeline / skeleton) and ``requests.*`` (bench.requests) of the two runs."""
    broker = {s: (runs.get(s) or {}).get("broker_us_per_record") for s in ("pipeline", "skeleton")}
    if broker["pipeline"] and broker["skeleton"]:
        figures.set("cost.broker_vs_skeleton", broker["pipeline"] / broker["skeleton"],
                    pipeline_us=broker["pipeline"], skeleton_us=broker["skeleton"])
    else:
        figures.set("cost.broker_vs_skeleton", None, unavailable="the broker is not a local process"
                    if env.kafka_pid is None else "no completions in a window")
    why = ("not counted: the broker is not the bench's own (--count-requests counts a given local one)"
           if not env.request_systems else "the broker's metrics could not be read (bench.requests)")
    for system in REQUEST_SYSTEMS:
        counted = (runs.get(system) or {}).get("requests")
        if not counted:
            figures.unavailable([k for k in FIGURE_KEYS if k.startswith(f"requests.{system}")], why)
            continue
        figures.set(f"requests.{system}_per_1k", counted["total_per_1k"],
                    by_api=counted["requests_per_1k"])
        figures.set(f"requests.{system}.produce_per_1k", counted["requests_per_1k"].get("Produce"))
        figures.set(f"requests.{system}.fetch_per_1k", counted["requests_per_1k"].get("FetchConsumer"))
        figures.set(f"requests.{system}.records_per_produce", counted["produce"]["records_per_request"])
        figures.set(f"requests.{system}.bytes_per_produce", counted["produce"]["bytes_per_request"])
        figures.set(f"requests.{system}.bytes_per_fetch", counted["fetch"]["bytes_per_response"])
    figures.ratio("requests.pipeline_vs_skeleton", "requests.pipeline_per_1k", "requests.skeleton_per_1k")


def compiler_cpu(env: Env) -> float | None:
    """CPU seconds the broker's JIT compiler threads have used (its pid known), or None."""
    from broker.bench.cost import thread_cpu

    threads = thread_cpu(env.kafka_pid)
    return sum(s for name, s in threads.items() if "Compiler" in name) if threads else None


def warm_broker(env: Env, budget_s: float, *, quiet_share: float = 0.1) -> dict[str, Any]:
    """Pipeline and raw traffic, unmeasured, until the broker's JIT compiler threads use less
    than ``quiet_share`` of a core over a round - or ``budget_s`` of traffic was sent. A
    fresh broker on this 2-core machine spends about a minute of compiler CPU before its
    code settles (``jstat -compiler``); a broker in service has long done so. Without the
    broker's pid (a remote cluster), one round."""
    rounds = []
    spent = 0.0
    while spent < budget_s:
        before, t0 = compiler_cpu(env), time.monotonic()
        run_hop(env, "pipeline", duration=4.0)
        run_hop(env, "raw", duration=2.0)
        spent += 6.0
        after = compiler_cpu(env)
        if before is None or after is None:
            break
        share = (after - before) / (time.monotonic() - t0)
        rounds.append(round(share, 3))
        if share < quiet_share:
            break
    return {"seconds": spent, "compiler_share_per_round": rounds}


def measure_latency(env: Env, figures: Figures, *, rate: float, duration: float, warm: float = 0.0,
                    progress: Progress | None = None) -> dict[str, Any]:
    """Fill ``latency.*`` at ``rate`` records/s (50 % of the pipeline's measured peak): the
    steady state, records sent after the first ``warm`` seconds of the run (as throughput
    leaves its first seconds out). The pipeline's first second from idle to the load is
    slower (seen: p99 650-900 ms, then 180-220 ms from the next second on, in both the time
    to the decision and from the decision to visible): its p99 is its own figure,
    ``latency.pipeline_start_p99_ms``."""
    figures.set("latency.load_rps", rate)
    figures.set("latency.p99_budget_ms", env.commit_interval_ms + 100.0)
    series: dict[str, Any] = {"rate": rate}
    for i, system in enumerate(("raw", "pipeline")):
        step = (lambda f, i=i, s=system: progress((i + f) / 2, s)) if progress else None
        if step:
            step(0.0)
        # the pipeline's completion times from one persist partition of P: a tail of all of
        # them would cost the cores as much as a stage of the pipeline
        run = run_hop(env, system, duration=duration, rate=rate, warm=warm, drain=True,
                      drain_timeout=60 + duration * 4, on_progress=step, tail="sample")
        every = run.latencies_ms()
        steady = run.created_ms >= (run.t0 + warm) * 1000
        lat = every[steady]
        if lat.size == 0:
            raise BenchError(f"{system}: no latencies recorded after the first {warm:g} s")
        if system == "pipeline":
            if (~steady).any():
                figures.set("latency.pipeline_start_p99_ms", float(np.percentile(every[~steady], 99)),
                            samples=int(np.count_nonzero(~steady)), window_s=warm)
            else:
                figures.set("latency.pipeline_start_p99_ms", None, unavailable=f"no warm window (warm={warm:g} s)")
        p50, p99, p999 = np.percentile(lat, [50, 99, 99.9])
        figures.set(f"latency.{system}_p50_ms", float(p50), samples=int(lat.size))
        figures.set(f"latency.{system}_p99_ms", float(p99), samples=int(lat.size), max_ms=round(float(lat.max()), 1))
        figures.set(f"latency.{system}_p999_ms", float(p999), samples=int(lat.size))
        series[system] = lat
        series[f"{system}_cpu"] = run.cpu_report(per_sent=True)
        if run.requests is not None:
            series[f"{system}_requests"] = run.requests
        if run.cost is not None:
            series[f"{system}_cost"] = run.cost
            record_cost(figures, system, run.cost)
        if system == "pipeline":
            series["breakdown"] = breakdown(env, run)
            record_check(figures, run.check)
    pipeline_p99 = figures.values["latency.pipeline_p99_ms"]
    if pipeline_p99.get("value") is not None:
        budget = env.commit_interval_ms + 100.0
        pipeline_p99["target"] = f"<= {budget:g} (commit interval + 100 ms)"
        pipeline_p99["met"] = bool(pipeline_p99["value"] <= budget)
    figures.ratio("latency.p99_vs_raw", "latency.pipeline_p99_ms", "latency.raw_p99_ms")
    figures.ratio("cost.bytes_vs_raw", "cost.pipeline.bytes_per_record", "cost.raw.bytes_per_record")
    figures.ratio("cost.broker_cpu_vs_raw", "cost.pipeline.broker_cpu_us_per_record",
                  "cost.raw.broker_cpu_us_per_record")
    return series


# The fixed load of latency.fixed_*: a tenth of the pipeline's peak on the 2-core machine
# (docs/benchmarks.md), so a busier or smaller host still keeps up with it.
FIXED_LOAD_RPS = 10_000.0


def measure_fixed_latency(env: Env, figures: Figures, *, duration: float, warm: float = 0.0) -> dict[str, Any]:
    """``latency.fixed_*``: the pipeline's latency at ``FIXED_LOAD_RPS`` whatever the peak.
    ``latency.pipeline_*`` run at 50 % of the peak measured in the same run, which moves
    with the peak (and its p99 with the load): two runs compare by these."""
    run = run_hop(env, "pipeline", duration=duration, rate=FIXED_LOAD_RPS, warm=warm, drain=True,
                  drain_timeout=60 + duration * 4, tail="sample")
    lat = run.latencies_ms()[run.created_ms >= (run.t0 + warm) * 1000]
    if lat.size == 0:
        raise BenchError(f"pipeline at {FIXED_LOAD_RPS:g} records/s: no latencies after the first {warm:g} s")
    p50, p99 = np.percentile(lat, [50, 99])
    figures.set("latency.fixed_load_rps", FIXED_LOAD_RPS)
    figures.set("latency.fixed_p50_ms", float(p50), samples=int(lat.size))
    figures.set("latency.fixed_p99_ms", float(p99), samples=int(lat.size), max_ms=round(float(lat.max()), 1))
    return {"rate": FIXED_LOAD_RPS, "p50_ms": float(p50), "p99_ms": float(p99), "samples": int(lat.size)}


def record_check(figures: Figures, check: dict[str, Any] | None) -> None:
    """``check.counters_vs_tail``: completions by the acker's counters (as throughput counts
    them) over those a tail read on the same persist partition, in a drained run - 1 exactly."""
    if not check or not check["tail"]:
        figures.set("check.counters_vs_tail", None, unavailable="the tail saw no completion")
        return
    figures.set("check.counters_vs_tail", check["counters"] / check["tail"], **check)
    entry = figures.values["check.counters_vs_tail"]
    entry["target"], entry["met"] = "= 1", check["counters"] == check["tail"]


def record_cost(figures: Figures, system: str, spent: dict[str, Any]) -> None:
    """``cost.<system>.*`` from ``bench.cost.compare`` of a drained run."""
    from broker.bench.figures import COST_ROLES

    why = "the broker's log directory is not on this host"
    figures.set(f"cost.{system}.writes_per_record", spent["writes_per_record"])
    figures.set(f"cost.{system}.bytes_per_record", spent["bytes_per_record"], unavailable=why)
    cpu = sum(spent["broker_cpu_us_per_record"].values())
    figures.set(f"cost.{system}.broker_cpu_us_per_record", cpu or None,
                unavailable="the broker is not a local process")
    if system != "pipeline":
        return
    figures.set("cost.pipeline.txn_markers_per_record", spent["markers_per_record"])
    for role in COST_ROLES:
        topic = spent["topics"].get(role)
        if topic is None:
            figures.set(f"cost.pipeline.{role}.writes_per_record", None, unavailable="nothing appended")
            figures.set(f"cost.pipeline.{role}.bytes_per_record", None, unavailable="nothing appended")
            continue
        figures.set(f"cost.pipeline.{role}.writes_per_record", topic["writes_per_record"])
        figures.set(f"cost.pipeline.{role}.bytes_per_record", topic.get("bytes_per_record"), unavailable=why)


def breakdown(env: Env, run: HopRun) -> dict[str, dict[str, float]]:
    """Where a completion's latency goes, from the CreateTimes the producers set:

    1. ``persist -> ack event``: the source's persist record to the task's XorBatch holding
       the srid's event (source linger, task consume batching, handler, produce);
    2. ``ack event -> tombstone``: the acker fetching the event, folding it and waiting for
       its next commit (the tombstone's CreateTime is taken when the commit produces it);
    3. ``tombstone -> visible``: the transaction commit and the tail's fetch.
    """
    from broker import ids, topics
    from broker.schemas import XorBatch

    assert run.namespace is not None
    ns = topics.Namespace(run.namespace)
    persist: dict[int, int] = {}
    tombstone: dict[int, int] = {}
    for m in read_all(env, ns.persist, env.partitions):
        srid = ids.decode_id(m.key())
        (persist if m.value() is not None else tombstone)[srid] = m.timestamp()[1]
    ack: dict[int, int] = {}
    batch_sizes = []
    for m in read_all(env, ns.acks, env.partitions):
        xb = XorBatch.decode(m.value())
        batch_sizes.append(int(xb.srids.size))
        for srid in xb.srids.tolist():
            ack.setdefault(srid, m.timestamp()[1])
    t0_ms = (run.t0 + run.warm) * 1000  # the steady state, as the latency figures
    both = [s for s, t in persist.items() if t >= t0_ms and s in ack and s in tombstone]
    stages = {
        "persist -> ack event": np.array([ack[s] - persist[s] for s in both], dtype=float),
        "ack event -> tombstone": np.array([tombstone[s] - ack[s] for s in both], dtype=float),
    }
    decided = run.extra.get("decided_ms")
    if decided is not None and decided.size == run.recv.size:
        steady = run.created_ms >= t0_ms
        stages["tombstone -> visible"] = (run.recv * 1000 - decided)[steady]
        stages["persist -> tombstone"] = (decided - run.created_ms)[steady]
    out = {name: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}
           for name, v in stages.items() if v.size}
    out["xor_batch"] = {"mean_events": float(np.mean(batch_sizes)) if batch_sizes else 0.0,
                        "batches": float(len(batch_sizes))}
    return out


def _summary(run: HopRun) -> dict[str, Any]:
    w = run.window
    return {
        "sent": run.sent,
        "send_seconds": round(run.t1 - run.t0, 3),
        "sent_rps": round(run.sent / max(run.t1 - run.t0, 1e-3), 1),
        "window_seconds": None if w is None else round(w.seconds, 3),
        "completed_in_window": None if w is None else w.completed,
        "throughput_rps": round(run.throughput(), 1),
        "cpu_us_per_record": run.cpu_us_per_record(),
        "cpu": run.cpu_report(),
        "broker_us_per_record": None if w is None or KAFKA not in w.cpu_s else w.us_per_record(w.cpu_s[KAFKA]),
        "requests": run.requests,
        "recv_rel": (run.recv - run.t0),
    }
