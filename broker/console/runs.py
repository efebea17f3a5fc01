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

A run outlives its console: the audit record of its start holds the plan's ``Selection``
(its filter, how far ``ns.dlq`` was indexed, when), and each pass's record in
``ns.dlq.redriven`` names the run. A console started again restores its runs from the two
(``restore``, once its index has caught up): a run not complete is ``cancelled`` or, when
its console stopped under it, ``interrupted`` - both can be resumed, and the resumed run
takes the same records again, never one dead-lettered after the plan.
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
from broker.console.index import EntryRow, Filter, Index, Selection
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
    sample: list[EntryRow]
    by: str
    at: float
    selection: Selection

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
    state: str = "running"  # running, cancelling, cancelled, interrupted, completed, failed
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


def started(plan: Plan, run: Run) -> dict[str, Any]:
    """What the audit record of a run's start holds: with the plan's selection and the run's
    id, what a console started again restores the run from (``Redrives.restore``)."""
    return {"plan": plan.id, "run": run.id, "rate_per_s": run.rate_per_s, "filter": plan.filter.as_json(),
            "count": plan.count, "selection": plan.selection.to_record()}


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
        keys, per_topic, sample, selection = self.index.plan(f)
        plan = Plan(secrets.token_urlsafe(12), f, tuple(keys), per_topic, sample, by, time.time(), selection)
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
                    only=run.plan.keys, keep_going=keep_going, who=run.by, run_id=run.id,
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

    def restore(self) -> int:
        """The runs of earlier consoles, from the audit log and ``ns.dlq.redriven`` as the
        index holds them (call it once the index has caught up) -> how many were restored.
        A run this console knows already is left as it is."""
        started: dict[str, dict[str, Any]] = {}
        resumed_by: dict[str, str] = {}
        for event in self.index.audited(("redrive start", "redrive resume")):
            what = event.get("what") or {}
            run_id = what.get("run")
            if not isinstance(run_id, str) or not str(event.get("result", "")).startswith("ok"):
                continue
            if event["action"] == "redrive start" and isinstance(what.get("selection"), dict):
                started[run_id] = event
            elif run_id in started:
                resumed_by[run_id] = str(event.get("who"))
        restored = 0
        for run_id, event in started.items():
            with self._lock:
                if run_id in self.runs:
                    continue
            what = event["what"]
            try:
                selection = Selection.from_record(what["selection"])
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("console redrive %s: its audit record holds no selection (%s): not restored", run_id, exc)
                continue
            taken = self.index.selected(selection)
            per_topic: dict[str, int] = {}
            for _, topic, _ in taken:
                per_topic[topic] = per_topic.get(topic, 0) + 1
            plan = Plan(str(what.get("plan", "")), selection.filter, tuple(key for key, _, _ in taken), per_topic, [],
                        str(event.get("who")), selection.at_ms / 1000, selection)
            rate = what.get("rate_per_s")
            run = Run(run_id, plan, float(rate) if rate else None, resumed_by.get(run_id, str(event.get("who"))),
                      int(event.get("at_ms") or 0) / 1000)
            run.done = sum(1 for _, _, redriven in taken if redriven)
            passes = self.index.runs_of(run_id)
            run.records = passes
            if run.done >= run.total:
                run.state = "completed"
            elif passes and passes[-1].get("state") == "cancelled":
                run.state = "cancelled"
            else:
                run.state = "interrupted"  # its console stopped while it ran
            with self._lock:
                self.runs.setdefault(run_id, run)
            restored += 1
        return restored

    def page(self, start: int = 0, size: int = 20) -> tuple[list[Run], int]:
        """The runs, newest first, ``size`` from ``start`` -> (those, how many in all)."""
        with self._lock:
            runs = sorted(self.runs.values(), key=lambda r: r.started, reverse=True)
        return runs[start : start + size], len(runs)

    def _run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise ConfigurationError(f"no redrive run {run_id!r} in this console")
        return run

    def wait(self, run_id: str, timeout_s: float) -> None:
        thread = self._run(run_id)._thread
        if thread is not None:
            thread.join(timeout_s)
