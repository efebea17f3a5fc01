"""run_in_background(): the loop on a thread while the block runs, stopped on leaving it."""

from __future__ import annotations

import contextlib
import threading
from typing import Self

import pytest

from broker.background import BackgroundError, running


class _Service:
    def __init__(self, *, fail_check: bool = False, crash: bool = False) -> None:
        self._stop = threading.Event()
        self.fail_check, self.crash, self.ran = fail_check, crash, threading.Event()

    def check_before_run(self) -> None:
        if self.fail_check:
            raise ValueError("no such topic")

    def run(self) -> None:
        self.ran.set()
        if self.crash:
            raise RuntimeError("loop died")
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def run_in_background(self) -> contextlib.AbstractContextManager[Self]:
        return running(self)


def test_the_loop_runs_during_the_block_and_stops_after_it() -> None:
    service = _Service()
    with service.run_in_background() as running:
        assert running is service
        assert service.ran.wait(10)
        assert not service._stop.is_set()
    assert service._stop.is_set()


def test_a_service_that_cannot_start_raises_in_the_caller_before_any_thread() -> None:
    service = _Service(fail_check=True)
    with pytest.raises(ValueError, match="no such topic"), service.run_in_background():
        pass
    assert not service.ran.is_set()


def test_a_loop_that_died_is_reported_when_the_block_ends() -> None:
    service = _Service(crash=True)
    with pytest.raises(BackgroundError, match="loop died"), service.run_in_background():
        assert service.ran.wait(10)
