"""A service's loop on a thread of the calling process (``run_in_background()`` of ``Acker``,
``Task`` and ``Bridge``): one process for development, a quickstart and a user's tests. In
production each service is a process of its own (``replaybroker acker``, ``task``,
``bridge``)."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from broker.errors import BackgroundError

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0
"""How long leaving the block waits for the loop's clean shutdown (final commit, close)."""


@contextlib.contextmanager
def in_background(name: str, run: Callable[[], object], stop: Callable[[], None]) -> Iterator[threading.Thread]:
    """Run ``run()`` on a daemon thread while the block runs; on leaving it, ``stop()`` and
    wait for the loop to end. An exception of the loop is raised when the block is left (as
    ``BackgroundError``), unless the block raised one of its own."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            failure.append(exc)
            log.exception("%s stopped", name)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop()
        thread.join(STOP_WAIT_S)
        if thread.is_alive():
            log.error("%s did not stop within %.0fs", name, STOP_WAIT_S)
    if failure:
        raise BackgroundError(f"{name} stopped: {failure[0]!r}") from failure[0]


class Service(Protocol):
    """What ``running()`` needs of a service: a loop, a way to end it, and what makes it
    refuse to start (topics missing, ...)."""

    def check_before_run(self) -> None: ...

    def run(self) -> object: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


@contextlib.contextmanager
def running(service: S) -> Iterator[S]:
    """``run_in_background()`` of a service: its loop on a thread of this process while a
    ``with`` block runs, then a clean stop - for development and tests. What makes the service
    refuse to start (``check_before_run``) raises at once, in the caller. A function over the
    service's own ``run`` and ``stop``, not a base class: the service keeps all its state."""
    service.check_before_run()
    with in_background(type(service).__name__.lower(), service.run, service.stop):
        yield service


SERVICE_GC_THRESHOLDS = (50_000, 20, 10)
"""``gc.set_threshold`` of a service process: a young collection per 50 000 objects kept
instead of per 700. A service's batches keep thousands of objects alive for a moment; at the
default each batch set off collections that found nothing and moved its objects to the old
generations, whose full collections then walked everything (docs/benchmarks.md)."""


def tune_gc_for_service() -> None:
    """Garbage collection for a process that runs one service loop (``replaybroker acker``,
    ``task``, ``bridge``): what exists at start (modules, clients) is frozen out of every
    collection, and young collections wait for ``SERVICE_GC_THRESHOLDS``. Reference counting
    still frees everything at once; only reference cycles wait longer. Not done by the
    library itself: a ``Source`` or ``Task`` in a user's process leaves its collector alone."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVICE_GC_THRESHOLDS)
