"""A service process's garbage collection (``broker.background.tune_gc_for_service``), run in
a fresh interpreter: it changes process-wide state."""

from __future__ import annotations

import json
import subprocess
import sys

from broker.background import SERVICE_GC_THRESHOLDS


def test_a_service_freezes_what_exists_at_start_and_collects_young_garbage_less_often() -> None:
    code = (
        "import gc, json, broker.background as b\n"
        "before = gc.get_threshold()\n"
        "b.tune_gc_for_service()\n"
        "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, after, frozen = json.loads(out)
    assert before == [700, 10, 10]  # the interpreter's default: only the call changes it
    assert tuple(after) == SERVICE_GC_THRESHOLDS
    assert frozen > 1000  # the modules and objects of the start-up
