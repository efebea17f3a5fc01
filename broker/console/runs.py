"""Redrive from the console: a plan first, a run bound to it, in the background.

1. ``plan``: the index selects the records a filter takes that are not redriven yet; the
   plan keeps their marker keys, counts per data topic and a sample, under a random id and a
   digest of what it holds;
2. ``start``: the confirm names the plan's id and digest; the run redrives through
   ``broker.dlq.redrive`` with ``only`` = the plan's keys, so nothing the operator did not see
   is sent (a record dead-lettered after the plan waits for the next one);
3. ``cancel`` stops it after the chunk in flight (one transaction per chunk: what is
   committed went out, what is not did not); ``resume`` runs the same plan again - the
   markers make the records already redriven skip.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from broker import dlq
from broker.console.index import Filter, Index, Row
from broker.errors import ConfigurationError, ReplayBrokerError
from broker.settings import KafkaSettings

log = logging.getLogger(__name__)

PLAN_TTL_S = 15 * 60
MAX_RATE = 10_000.0


@dataclass(frozen=True)
class Plan:
    id: str
    filter: Filter
    keys: tuple[bytes, ...]
    per_topic: dict[str, int]
    sample: list[Row]
    by: str
    at: float

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def digest(self) -> str:
        """Binds a confirm to this plan's contents, not only its id."""
        h = hashlib.sha256(self.id.encode())
        for key in self.keys:
            h.update(len(key).to_bytes(4, "big") + key)
        return h.hexdigest()[:32]


@dataclass
class Run:
    id: str
    plan: Plan
    rate_per_s: float | None
    by: str
    started: float
    state: str = "running"  # running, cancelling, cancelled, completed, failed
    done: int = 0
    error: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)  # what dlq recorded per pass
    _cancel: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def total(self) -> int:
        return self.plan.count

    @property
    def active(self) -> bool:
        return self.state in ("running", "cancelling")


def parse_rate(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        rate = float(text)
    except ValueError:
        raise ConfigurationError(f"a rate is a number of records per second, not {text!r}") from None
    if not 0 < rate <= MAX_RATE:
        raise ConfigurationError(f"a rate must be above 0 and at most {MAX_RATE:g} records per second")
    return rate


def where_of(f: Filter) -> dlq.RedriveFilter:
    """The part of a console filter ``broker.dlq`` can check itself (the header is checked by
    the plan's keys)."""
    return dlq.RedriveFilter(
        reason_prefix=f.reason_prefix or None,
        topics=[f.topic] if f.topic else None,
        keys=[f.key] if f.key is not None else None,
        since_ms=f.since_ms,
        until_ms=f.until_ms,
    )


class Redrives:
    def __init__(self, settings: KafkaSettings, namespace: str, index: Index) -> None:
        self.settings, self.namespace, self.index = settings, namespace, index
        self.plans: dict[str, Plan] = {}
        self.runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    def plan(self, f: Filter, by: str) -> Plan:
        keys, per_topic, sample = self.index.plan(f)
        plan = Plan(secrets.token_urlsafe(12), f, tuple(keys), per_topic, sample, by, time.time())
        with self._lock:
            now = time.time()
            for pid in [p for p, old in self.plans.items() if now - old.at > PLAN_TTL_S]:
                del self.plans[pid]
            self.plans[plan.id] = plan
        return plan

    def bound_plan(self, plan_id: str, digest: str) -> Plan:
        """The plan a confirm names, if the confirm is for what it holds now."""
        plan = self.plans.get(plan_id)
        if plan is None or time.time() - plan.at > PLAN_TTL_S:
            raise ConfigurationError("this plan is unknown or expired: make a new dry run")
        if not secrets.compare_digest(plan.digest, digest):
            raise ConfigurationError("the confirm does not match the plan it names: make a new dry run")
        return plan

    def start(self, plan: Plan, rate_per_s: float | None, by: str) -> Run:
        with self._lock:
            if any(r.active for r in self.runs.values()):
                raise ConfigurationError("a redrive is running: cancel it or wait for it first")
            run = Run(secrets.token_urlsafe(8), plan, rate_per_s, by, time.time())
            self.runs[run.id] = run
            self._launch(run)
        return run

    def _launch(self, run: Run) -> None:
        run._cancel.clear()
        run.state, run.error = "running", None
        before = run.done

        def keep_going(done: int) -> bool:
            run.done = before + done
            return not run._cancel.is_set()

        def go() -> None:
            try:
                result = dlq.redrive(
                    self.settings, self.namespace, where=where_of(run.plan.filter), rate_per_s=run.rate_per_s,
                    only=run.plan.keys, keep_going=keep_going, who=run.by,
                )
                run.done = before + len(result.redriven)
                if result.run is not None:
                    run.records.append(result.run)
                run.state = "cancelled" if run._cancel.is_set() and run.done < run.total else "completed"
            except ReplayBrokerError as exc:
                run.state, run.error = "failed", str(exc)
                log.warning("console redrive %s failed: %s", run.id, exc)

        run._thread = threading.Thread(target=go, name=f"console-redrive-{run.id}", daemon=True)
        run._thread.start()

    def cancel(self, run_id: str) -> Run:
        run = self._run(run_id)
        if run.active:
            run.state = "cancelling"
            run._cancel.set()
        return run

    def resume(self, run_id: str, by: str) -> Run:
        with self._lock:
            run = self._run(run_id)
            if run.active:
                raise ConfigurationError("this redrive is still running")
            if run.state == "completed":
                raise ConfigurationError("this redrive is complete: nothing to resume")
            if any(r.active for r in self.runs.values()):
                raise ConfigurationError("another redrive is running")
            run.by = by
            self._launch(run)
        return run

    def _run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise ConfigurationError(f"no redrive run {run_id!r} in this console")
        return run

    def wait(self, run_id: str, timeout_s: float) -> None:
        thread = self._run(run_id)._thread
        if thread is not None:
            thread.join(timeout_s)
