"""The run's outputs: ``<stamp>.json``, ``<stamp>.md`` (figures beside their baselines) and
``<stamp>-*.png`` plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from broker.bench.figures import FOLD_SIZES, SPECS, size_label

# (figure, its key, baseline, the baseline's key, ratio key)
Row = tuple[str, str, str, str | None, str | None]


def _rows() -> list[Row]:
    rows: list[Row] = [
        ("throughput, completed records/s", "throughput.pipeline_rps", "raw produce -> consume",
         "throughput.raw_rps", "throughput.pipeline_vs_raw"),
        ("throughput, completed records/s", "throughput.pipeline_rps", "share group, explicit ACCEPT",
         "throughput.share_rps", "throughput.pipeline_vs_share"),
        ("throughput, completed records/s", "throughput.pipeline_rps", "skeleton: the same Kafka calls, no logic",
         "throughput.skeleton_rps", "throughput.pipeline_vs_skeleton"),
        ("skeleton throughput (the ceiling)", "throughput.skeleton_rps", "raw produce -> consume",
         "throughput.raw_rps", "throughput.skeleton_vs_raw"),
        ("CPU µs per completed record (processes + broker)", "cpu.pipeline_us_per_record",
         "share group (ratio: share ÷ pipeline)", "cpu.share_us_per_record", "cpu.pipeline_vs_share"),
        ("CPU µs per completed record (processes + broker)", "cpu.pipeline_us_per_record", "skeleton",
         "cpu.skeleton_us_per_record", None),
        ("CPU µs per completed record (processes + broker)", "cpu.pipeline_us_per_record", "raw produce -> consume",
         "cpu.raw_us_per_record", None),
    ]
    for n in FOLD_SIZES:
        s = size_label(n)
        rows.append((f"fold pairs/s/core, {s} pending", f"fold.{s}.table_pairs_per_s", "plain dict fold",
                     f"fold.{s}.dict_pairs_per_s", f"fold.{s}.table_vs_dict"))
    for n in FOLD_SIZES:
        s = size_label(n)
        rows.append((f"bytes per pending entry, {s}", f"fold.{s}.table_bytes_per_entry", "plain dict fold",
                     f"fold.{s}.dict_bytes_per_entry", None))
    for name in ("kafka", "spark"):
        rows.append((f"{name} key partition µs, 256 new keys together", f"keys.{name}_batch_us_per_key",
                     "one at a time", f"keys.{name}_one_us_per_key", f"keys.{name}_one_vs_batch"))
    rows += [
        ("completion latency p50 ms (50 % load)", "latency.pipeline_p50_ms", "raw produce -> consume p50",
         "latency.raw_p50_ms", None),
        ("completion latency p99 ms (50 % load)", "latency.pipeline_p99_ms", "raw produce -> consume p99",
         "latency.raw_p99_ms", "latency.p99_vs_raw"),
        ("completion latency p99.9 ms (50 % load)", "latency.pipeline_p999_ms", "raw produce -> consume p99.9",
         "latency.raw_p999_ms", None),
        ("completion latency p99 ms, fixed load", "latency.fixed_p99_ms", "at 50 % of this run's peak",
         "latency.pipeline_p99_ms", None),
        ("replay after explicit fail p50 ms", "replay.after_fail_p50_ms", "configured timeout", "replay.timeout_ms",
         None),
        ("replay after explicit fail p99 ms", "replay.after_fail_p99_ms", "configured timeout", "replay.timeout_ms",
         "replay.after_fail_vs_timeout"),
        ("replay after timeout p50 ms", "replay.after_timeout_p50_ms", "configured timeout", "replay.timeout_ms",
         None),
        ("replay after timeout p99 ms", "replay.after_timeout_p99_ms", "configured timeout", "replay.timeout_ms",
         "replay.after_timeout_vs_timeout"),
        ("changelog restore, entries/s", "restore.entries_per_s", "-", None, None),
        ("Kafka records appended per record", "cost.pipeline.writes_per_record", "raw produce -> consume",
         "cost.raw.writes_per_record", None),
        ("bytes appended per record", "cost.pipeline.bytes_per_record", "raw produce -> consume",
         "cost.raw.bytes_per_record", "cost.bytes_vs_raw"),
        ("broker CPU µs per record", "cost.pipeline.broker_cpu_us_per_record", "raw produce -> consume",
         "cost.raw.broker_cpu_us_per_record", "cost.broker_cpu_vs_raw"),
        ("Spark order job under Acking, records/s", "spark.acked_rps", "same job, no acking, same run",
         "spark.plain_rps", "spark.acked_vs_plain"),
        ("Spark order job under Acking, larger batches, rec/s", "spark.large_acked_rps", "same job, no acking, same run",
         "spark.large_plain_rps", "spark.large_acked_vs_plain"),
        ("OriginDeltaSink (window) batch ms, large table", "spark.sink_large_batch_p50_ms", "small table",
         "spark.sink_small_batch_p50_ms", "spark.sink_batch_growth"),
        ("OriginParquetSink batch ms, large sink", "spark.parquet_sink_large_batch_p50_ms", "small sink",
         "spark.parquet_sink_small_batch_p50_ms", "spark.parquet_sink_batch_growth"),
        ("OriginDeltaSink batch ms (mean), optimize_every", "spark.optimize.batch_mean_ms", "never compacted",
         "spark.optimize.plain_batch_mean_ms", "spark.optimize.batch_cost"),
        ("scale: acker CPU µs per record, P=1000", "scale.p1000.cpu_us_per_record", "P=16",
         "scale.p16.cpu_us_per_record", "scale.cpu_p1000_vs_p16"),
        ("scale: CPU µs per record, 4 ackers in total", "scale.ackers4.cpu_us_per_record", "1 acker",
         "scale.ackers1.cpu_us_per_record", "scale.acker_cpu_4_vs_1"),
        ("scale: `status` s, P=1000", "scale.status_p1000_s", "P=16", "scale.p16.status_s", None),
        ("scale: a task's longest pause ms, another joins", "scale.task_join_max_gap_ms",
         "eager range assignor", "scale.task_join_max_gap_ms_eager", None),
        ("scale: takeover s after the session, standby", "scale.takeover_standby_s", "without standby",
         "scale.takeover_cold_s", None),
        ("scale: idle acker, % of a core", "scale.idle_acker_cpu_pct", "idle task", "scale.idle_task_cpu_pct", None),
    ]
    return rows


def fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:.2f} M"
    if a >= 1e4:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _cell(figures: dict[str, dict[str, Any]], key: str | None) -> str:
    if key is None:
        return "-"
    entry = figures[key]
    return fmt(entry.get("value")) if entry.get("value") is not None else "n/a"


def _target(figures: dict[str, dict[str, Any]], *keys: str | None) -> tuple[str, str]:
    for key in keys:
        if key is None:
            continue
        entry = figures[key]
        spec = SPECS[key]
        if "target" in entry:
            return entry["target"], "yes" if entry.get("met") else "**no**"
        if spec.target is not None:
            return f"{spec.target[0]} {spec.target[1]:g}", "n/a"
    return "", ""


def markdown(result: dict[str, Any]) -> str:
    figures = result["figures"]
    meta = result["meta"]
    out = [
        f"# replaybroker bench - {meta['stamp']}",
        "",
        f"mode **{meta['mode']}** · Kafka {meta['kafka']} · {meta['partitions']} partitions · "
        f"{meta['cpus']} CPUs · load average {meta['loadavg_start']} -> {meta['loadavg_end']} · "
        f"{meta['seconds']:.0f} s · commit `{meta.get('git_commit') or '?'}`",
        "",
    ]
    if meta.get("noisy"):
        out += [f"> {meta['noisy']}", ""]
    out += [
        "| figure | value | baseline | baseline value | ratio | target | met |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for label, key, base_label, base_key, ratio_key in _rows():
        target, met = _target(figures, ratio_key, key)
        ratio = _cell(figures, ratio_key) + ("x" if ratio_key and figures[ratio_key].get("value") else "")
        out.append(f"| {label} | {_cell(figures, key)} | {base_label} | {_cell(figures, base_key)} | "
                   f"{ratio if ratio_key else '-'} | {target} | {met} |")
    runs = result.get("details", {}).get("throughput") or {}
    cpu_lines = []
    for system in ("raw", "share", "pipeline", "skeleton"):
        cpu = (runs.get(system) or {}).get("cpu")
        if cpu:
            parts = [f"{name} {c['core_pct']:.0f} % ({c['us_per_record']:.0f} µs/record)" for name, c in cpu.items()]
            total = sum(c["us_per_record"] for c in cpu.values())
            cpu_lines.append(f"- {system}: {', '.join(parts)}; total {total:.0f} µs CPU per completed record")
    if cpu_lines:
        out += ["", "CPU in the throughput window (share of one core; CPU per record completed in it, counted "
                "without a tail: broker/bench/completions.py):", "", *cpu_lines]
    out += _headline(figures)
    out += request_lines({s: (runs.get(s) or {}).get("requests") for s in ("pipeline", "skeleton")},
                         "throughput window")
    warm = runs.get("warm_broker")
    if warm:
        shares = ", ".join(f"{100 * s:.0f} %" for s in warm.get("compiler_share_per_round", [])) or "not readable"
        out += ["", f"Before them, {warm['seconds']:.0f} s of unmeasured traffic warmed the broker; its JIT "
                f"compiler threads used {shares} of a core per round (warm below 10 %)."]
    lat = figures.get("latency.load_rps", {}).get("value")
    if lat:
        out += ["", f"Latency load: {fmt(lat)} records/s (50 % of the measured pipeline throughput); "
                f"budget for the pipeline p99: {fmt(figures['latency.p99_budget_ms'].get('value'))} ms."]
    lat_details = result.get("details", {}).get("latency") or {}
    cpu_lines = []
    for system in ("raw", "pipeline"):
        cpu = lat_details.get(f"{system}_cpu")
        if cpu:
            parts = [f"{name} {c['core_pct']:.0f} % ({c['us_per_record']:.0f} µs/record)" for name, c in cpu.items()]
            total = sum(c["us_per_record"] for c in cpu.values())
            cpu_lines.append(f"- {system}: {', '.join(parts)}; total {total:.0f} µs CPU per record")
    if cpu_lines:
        out += ["", "CPU at the latency load (the same rate for both, every record completes):", "", *cpu_lines]
    stages = lat_details.get("breakdown") or {}
    if stages:
        out += ["", "Where the pipeline's completion latency goes (Kafka CreateTimes, same host):", "",
                "| stage | p50 ms | p99 ms |", "|---|---:|---:|"]
        for name, q in stages.items():
            if "p50" in q:
                out.append(f"| {name} | {fmt(q['p50'])} | {fmt(q['p99'])} |")
        xb = stages.get("xor_batch")
        if xb:
            out.append(f"\n{xb['batches']:.0f} XorBatch records, {xb['mean_events']:.0f} events each on average.")
    out += request_lines({"pipeline": lat_details.get("pipeline_requests")}, "drained run at the latency load")
    out += _cost_lines(lat_details)
    out += _spark_lines(result.get("details", {}).get("spark") or {})
    unavailable = [(k, v["unavailable"]) for k, v in figures.items() if v.get("value") is None]
    if unavailable:
        out += ["", "## Unavailable", ""]
        reasons: dict[str, list[str]] = {}
        for key, reason in unavailable:
            reasons.setdefault(reason, []).append(key)
        for reason, keys in reasons.items():
            out.append(f"- {', '.join(f'`{k}`' for k in keys)}: {reason}")
    if result.get("errors"):
        out += ["", "## Errors", ""]
        for section, text in result["errors"].items():
            out.append(f"- **{section}**: `{text.splitlines()[0][:300]}`")
    out += ["", "## Every figure", "", "| key | value | unit | what |", "|---|---:|---|---|"]
    for key, entry in figures.items():
        out.append(f"| `{key}` | {fmt(entry.get('value'))} | {entry['unit']} | {SPECS[key].what} |")
    if result.get("files", {}).get("plots"):
        out += ["", "## Plots", ""]
        out += [f"![{Path(p).stem}]({Path(p).name})" for p in result["files"]["plots"]]
    return "\n".join(out) + "\n"


HEADLINE = ("cpu.pipeline_us_per_record", "cpu.pipeline_vs_share", "throughput.pipeline_vs_raw",
            "throughput.pipeline_vs_share", "throughput.pipeline_vs_skeleton", "latency.pipeline_p99_ms",
            "cost.broker_vs_skeleton", "requests.pipeline_vs_skeleton", "check.counters_vs_tail")


def _headline(figures: dict[str, dict[str, Any]]) -> list[str]:
    """The figures the pipeline's cost is judged by, on one line."""
    cells = [f"`{key}` {_cell(figures, key)}" for key in HEADLINE]
    return ["", "Headline: " + " · ".join(cells)]


def request_lines(counted: dict[str, dict[str, Any] | None], where: str) -> list[str]:
    """The broker's requests per 1 000 completed records by API, and per topic role
    (bench.requests), one column per system."""
    have = {s: c for s, c in counted.items() if c}
    if not have:
        return []
    systems = list(have)
    apis = sorted({a for c in have.values() for a in c["requests_per_1k"]},
                  key=lambda a: -max(c["requests_per_1k"].get(a, 0.0) for c in have.values()))
    out = ["", f"The broker's requests per 1 000 completed records ({where}; its own metrics, bench.requests):", "",
           "| request | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    out += [f"| {api} | " + " | ".join(fmt(have[s]["requests_per_1k"].get(api)) for s in systems) + " |"
            for api in apis]
    out.append("| **total** | " + " | ".join(fmt(have[s]["total_per_1k"]) for s in systems) + " |")
    for label, part, key in (("records / Produce", "produce", "records_per_request"),
                             ("bytes / Produce", "produce", "bytes_per_request"),
                             ("record bytes / Fetch response", "fetch", "bytes_per_response")):
        out.append(f"| {label} | " + " | ".join(fmt(have[s][part][key]) for s in systems) + " |")
    out += ["", "By topic (requests touching it per 1 000 records; bytes per record):", "",
            "| system | topic | Produce | Fetch | records in | bytes in | bytes out |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for s in systems:
        for role, t in have[s]["topics"].items():
            out.append(f"| {s} | {role} | {fmt(t['produce_requests_per_1k'])} | {fmt(t['fetch_requests_per_1k'])} | "
                       f"{fmt(t['records_in_per_record'])} | {fmt(t['bytes_in_per_record'])} | "
                       f"{fmt(t['bytes_out_per_record'])} |")
    return out


def _cost_lines(lat_details: dict[str, Any]) -> list[str]:
    """Per topic: what one record appends; per broker thread group: its CPU (bench.cost)."""
    out: list[str] = []
    spent = {s: lat_details.get(f"{s}_cost") for s in ("raw", "pipeline")}
    if not any(spent.values()):
        return out
    out += ["", "What one completed record costs the broker (drained run at the latency load; "
            "records, transaction markers and bytes appended per record):", "",
            "| system | topic | records | markers | bytes |", "|---|---|---:|---:|---:|"]
    for system, cost in spent.items():
        for role, t in (cost or {}).get("topics", {}).items():
            out.append(f"| {system} | {role} | {fmt(t['writes_per_record'])} | {fmt(t['markers_per_record'])} "
                       f"| {fmt(t.get('bytes_per_record'))} |")
    threads = {s: (c or {}).get("broker_cpu_us_per_record") or {} for s, c in spent.items()}
    names = sorted({n for t in threads.values() for n in t}, key=lambda n: -threads["pipeline"].get(n, 0.0))
    if names:
        out += ["", "The broker's CPU per record by thread group (µs):", "",
                "| thread group | raw | pipeline |", "|---|---:|---:|"]
        for name in names[:15]:
            out.append(f"| {name} | {fmt(threads['raw'].get(name))} | {fmt(threads['pipeline'].get(name))} |")
    return out


def _spark_lines(spark: dict[str, Any]) -> list[str]:
    """The micro-batch of the order job with and without Acking: time, jobs, stages; the sinks."""
    out: list[str] = []
    acking = spark.get("acking") or {}
    if "plain" in acking and "acked" in acking:
        out += ["", f"Spark (`{spark.get('master')}`): the order job over {spark.get('records')} orders, "
                f"{spark.get('batch_records')} offsets a micro-batch, {spark.get('rounds')} rounds alternating "
                "(the first left out):", "",
                "| variant | records/s | batch p50 ms | addBatch p50 ms | rows/batch | jobs/batch | stages/batch |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for variant in ("plain", "acked"):
            r = acking[variant]
            out.append(f"| {variant} | {fmt(r.get('records_per_s'))} | {fmt(r.get('batch_ms_p50'))} | "
                       f"{fmt(r.get('add_batch_ms_p50'))} | {fmt(r.get('rows_per_batch'))} | "
                       f"{fmt(r.get('jobs_per_batch'))} | {fmt(r.get('stages_per_batch'))} |")
        if "handler_ms_p50" in acking["acked"]:
            out.append(f"\nUnder Acking, p50 per batch: handler and outputs {fmt(acking['acked']['handler_ms_p50'])} ms,"
                       f" the ack step (events, collect, produce) {fmt(acking['acked']['ack_ms_p50'])} ms.")
        warm = acking.get("warm_up") or []
        if warm or acking.get("jit_share") is not None:
            rounds = ", ".join(f"{fmt(w.get('jit_share'))} ({fmt(w.get('seconds'))} s)" for w in warm) or "none"
            out.append(f"\nThe JIT compiler's share of the wall time: warm-up rounds {rounds}; "
                       f"the rounds kept {fmt(acking.get('jit_share'))}.")
    elif "error" in acking:
        out += ["", f"Spark, acked vs plain: {acking['error']}"]
    sinks = spark.get("sinks") or {}
    lines = []
    for kind in ("delta", "parquet"):
        if kind in sinks:
            ms = sinks[kind]["batch_ms"]
            lines.append(f"- {kind}: " + "; ".join(f"{size} rows: {', '.join(map(str, v))} ms"
                                                   for size, v in ms.items()))
    if lines:
        out += ["", f"Sink batches ({sinks.get('batch_rows')} new rows + {100 * sinks.get('replayed', 0):.0f} % "
                "replays each; the first is warm-up):", "", *lines]
    return out + _optimize_lines(spark.get("optimize") or {})


def _optimize_lines(optimize: dict[str, Any]) -> list[str]:
    """OriginDeltaSink with and without ``optimize_every``: batch times, each OPTIMIZE, files."""
    if "optimized" not in optimize:
        return []
    runs = "; ".join(f"{r['ms']} ms, {r['files_before']} -> {r['files_after']} files" for r in optimize["runs"])
    return ["", f"OriginDeltaSink, {optimize['rows']} rows, `optimize_every={optimize['optimize_every']}` against "
            f"never (batch ms; the first is warm-up):", "",
            *(f"- {name}: {', '.join(map(str, optimize[name]['batch_ms']))} ms; {optimize[name]['files']} files after"
              for name in ("optimized", "plain")),
            f"- OPTIMIZE runs: {runs or 'none'}"]


# --------------------------------------------------------------------------- plots


def _unavailable(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=9, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _fold_panel(ax: Any, sizes: list[int], table: list[float], plain: list[float | None], labels: tuple[str, str],
                target: tuple[float, str], ylabel: str, title: str) -> None:
    """One panel of the fold plot: the table's figure and the plain dict's (where measured)
    against the pending entries, log-log, with the target."""
    ax.plot(sizes, table, "o-", label=labels[0])
    pairs = [(n, v) for n, v in zip(sizes, plain, strict=True) if v]
    if pairs:
        ax.plot([n for n, _ in pairs], [v for _, v in pairs], "s--", label=labels[1])
    ax.axhline(target[0], color="red", lw=0.8, ls=":", label=target[1])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pending entries")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title)


def plots(result: dict[str, Any], series: dict[str, Any], directory: Path, stamp: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = result["figures"]
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        path = directory / f"{stamp}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    # throughput: the systems, and completions over time
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [("raw", "raw"), ("share", "share group"), ("pipeline", "pipeline"), ("skeleton", "skeleton")]
    values = [(figures.get(f"throughput.{k}_rps") or {}).get("value") or 0.0 for k, _ in names]
    bars = ax1.bar([label for _, label in names], values, color=["#999999", "#6b8fb3", "#d9822b", "#c9b18f"])
    for bar, (k, _), v in zip(bars, names, values, strict=True):
        ax1.annotate(fmt(v) if v else "n/a", (bar.get_x() + bar.get_width() / 2, max(v, 1)), ha="center",
                     va="bottom", fontsize=8)
        del k
    if any(values):
        ax1.set_yscale("log")
        ax1.set_ylim(bottom=100)
    ax1.set_ylabel("completed records/s")
    ax1.set_title("throughput (same records, partitions, layout)")
    runs = series.get("throughput", {})
    plotted = False
    for key, label in names:
        rel = runs.get(key, {}).get("recv_rel") if isinstance(runs.get(key), dict) else None
        if rel is not None and len(rel):
            ax2.plot(np.sort(rel), np.arange(1, len(rel) + 1), label=label)
            plotted = True
    if plotted:
        ax2.set_xlabel("seconds since the measured send started")
        ax2.set_ylabel("records completed")
        ax2.legend(fontsize=8, loc="upper left")
        ax2.set_title("completions over time")
    else:
        _unavailable(ax2, "no throughput runs")
    save(fig, "throughput")

    # fold: rate and memory per pending entry
    fold = series.get("fold") or {}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if fold.get("sizes"):
        sizes = fold["sizes"]
        _fold_panel(ax1, sizes, fold["table_rate"], fold["dict_rate"], ("LedgerTable.fold", "plain dict fold"),
                    (2e6, "target 2 M/s"), "pairs/s (one core)", "fold rate")
        _fold_panel(ax2, sizes, fold["table_bytes"], fold["dict_bytes"], ("LedgerTable", "plain dict"),
                    (48, "target 48 B"), "bytes per pending entry", "memory")
    else:
        _unavailable(ax1, "fold not measured")
        _unavailable(ax2, "fold not measured")
    save(fig, "fold")

    # latency CDFs
    lat = series.get("latency") or {}
    fig, ax = plt.subplots(figsize=(7, 4))
    if lat.get("pipeline") is not None and lat.get("raw") is not None:
        for key, label in (("raw", "raw produce->consume"), ("pipeline", "pipeline persist->tombstone")):
            v = np.sort(np.asarray(lat[key]))
            ax.plot(v, np.linspace(0, 1, v.size, endpoint=False), label=label)
        budget = figures["latency.p99_budget_ms"].get("value")
        if budget:
            ax.axvline(budget, color="red", lw=0.8, ls=":", label=f"p99 budget {budget:g} ms")
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of records")
        ax.set_title(f"completion latency at {fmt(lat.get('rate'))} records/s (50 % of peak)")
        ax.legend(fontsize=8)
    else:
        _unavailable(ax, "latency not measured")
    save(fig, "latency")

    # replay latency against the timeout
    rep = series.get("replay") or {}
    fig, ax = plt.subplots(figsize=(7, 4))
    if rep.get("after_fail") is not None:
        data = [np.asarray(rep["after_fail"]), np.asarray(rep["after_timeout"])]
        ax.boxplot(data, vert=False, tick_labels=["after explicit fail", "after timeout"])
        ax.axvline(rep["timeout_ms"], color="red", lw=0.8, ls=":", label=f"timeout {rep['timeout_ms']} ms")
        ax.set_xlabel("ms until the replay record is visible")
        ax.set_title("replay latency")
        ax.legend(fontsize=8)
    else:
        _unavailable(ax, "replay not measured")
    save(fig, "replay")
    return written


def write_json(result: dict[str, Any], path: Path) -> None:
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
