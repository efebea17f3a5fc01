"""Replay latency after an explicit failure and after a timeout, against the timeout.

One pipeline run (source -> task -> acker) with a short per-record timeout. On first
attempts the task fails ``FAIL_RATE`` of its inputs (``ctx.fail``) and never acks
``DROP_RATE`` of them (``broker.dev.faults.skip_ack``); second attempts are acked, so every record
completes. The tail sees each replay record on ``<topic>.replay`` (read_committed: when the
acker's transaction holding it commits).

- after an explicit failure: replay visible - the task's wall time when it called ``fail``
  (the design's promise: at once, not after the timeout);
- after a timeout: replay visible - the original persist record's CreateTime; the acker
  should replay at ``timeout`` + up to one tick (100 ms) + up to one commit interval.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from broker.bench.figures import Figures
from broker.bench.hops import WARMUP_RECORDS, Env, run_hop
from broker.bench.procs import BenchError

FAIL_RATE = 0.1
DROP_RATE = 0.1


def measure_replay(env: Env, figures: Figures, *, timeout_ms: int, records: int, rate: float,
                   progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    figures.set("replay.timeout_ms", float(timeout_ms))
    step = (lambda f: progress(f, "failures injected")) if progress else None
    run = run_hop(
        env, "pipeline", records=records, rate=rate, drain=True,
        drain_timeout=records / rate + timeout_ms / 1000 * 2 + 60,
        task_options={"fail_rate": FAIL_RATE, "drop_rate": DROP_RATE, "inject_from": WARMUP_RECORDS},
        timeout_ms=timeout_ms, on_progress=step, tail="all",
    )
    task = run.done.get("task") or {}
    failed_at = {int(o): float(t) for o, t in task.get("failed_at", [])}
    dropped = {int(o) for o in task.get("dropped", [])}
    x = run.extra
    replay_at: dict[int, float] = {}
    for origin, attempt, t in zip(x["replay_origin"].tolist(), x["replay_attempt"].tolist(),
                                  x["replay_recv"].tolist(), strict=True):
        if attempt == 2:
            replay_at.setdefault(int(origin), float(t))
    first_ms = dict(zip(x["first_origin"].tolist(), x["first_persist_ms"].tolist(), strict=True))
    after_fail = np.array([(replay_at[o] - t) * 1000 for o, t in failed_at.items() if o in replay_at])
    after_timeout = np.array([replay_at[o] * 1000 - first_ms[o] for o in dropped if o in replay_at and o in first_ms])
    missing = (len(failed_at) + len(dropped)) - (after_fail.size + after_timeout.size)
    if after_fail.size == 0 or after_timeout.size == 0:
        raise BenchError(f"no replays observed (failed {len(failed_at)}, dropped {len(dropped)}, "
                         f"replays seen {len(replay_at)})")
    for name, lat in (("after_fail", after_fail), ("after_timeout", after_timeout)):
        p50, p99 = np.percentile(lat, [50, 99])
        figures.set(f"replay.{name}_p50_ms", float(p50), samples=int(lat.size))
        figures.set(f"replay.{name}_p99_ms", float(p99), samples=int(lat.size), max_ms=round(float(lat.max()), 1))
    figures.ratio("replay.after_fail_vs_timeout", "replay.after_fail_p99_ms", "replay.timeout_ms")
    figures.ratio("replay.after_timeout_vs_timeout", "replay.after_timeout_p99_ms", "replay.timeout_ms")
    return {"after_fail": after_fail, "after_timeout": after_timeout, "timeout_ms": timeout_ms,
            "missing": missing, "records": records}
