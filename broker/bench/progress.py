"""A plain-text progress bar on stderr (no dependency).

On a terminal it redraws one line (``\\r``); otherwise (CI logs, pipes) it prints one line
per stage and at most one line every 10 s within a stage, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    """Stages with weights (expected seconds); ``update(fraction)`` moves within a stage."""

    def __init__(self, stages: dict[str, float], stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self.stages = stages
        self.total = sum(stages.values()) or 1.0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self._done = 0.0
        self._stage: str | None = None
        self._fraction = 0.0
        self._detail = ""
        self._last_line = 0.0

    def start(self, stage: str, detail: str = "") -> None:
        if self._stage is not None:
            self.finish()
        self._stage, self._fraction, self._detail = stage, 0.0, detail
        self._draw(force=True)

    def update(self, fraction: float, detail: str | None = None) -> None:
        self._fraction = min(max(fraction, 0.0), 1.0)
        if detail is not None:
            self._detail = detail
        self._draw()

    def finish(self) -> None:
        if self._stage is None:
            return
        self._done += self.stages.get(self._stage, 0.0)
        self._stage, self._fraction = None, 0.0

    def close(self, message: str = "done") -> None:
        self.finish()
        self._detail = message
        self._draw(force=True, final=True)

    def _draw(self, *, force: bool = False, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not (self.tty or force or now - self._last_line >= 10):
            return
        self._last_line = now
        current = self.stages.get(self._stage, 0.0) * self._fraction if self._stage else 0.0
        share = 1.0 if final else min((self._done + current) / self.total, 0.999)
        filled = int(share * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        label = self._stage or ""
        detail = f" - {self._detail}" if self._detail else ""
        line = f"bench [{bar}] {share * 100:3.0f}% {now - self.started:5.0f}s {label}{detail}"
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r" + line[:160].ljust(100) + end)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
