"""Child processes of a run: the workers (``bench.workers``) and the acker service.

Each child's stderr goes to ``<workdir>/<name>.log`` (shown when something goes wrong);
workers speak JSON lines on stdout, read here by one thread per child. With a profile
directory every child runs under pyinstrument and leaves ``<name>.txt`` there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import orjson


class BenchError(RuntimeError):
    """A run could not be measured (a process died, a warm-up never completed...)."""


def _python(module: str, args: list[str], name: str, profile_dir: Path | None) -> list[str]:
    if profile_dir is None:
        return [sys.executable, "-m", module, *args]
    out = profile_dir / f"{name}.pyisession"
    return [sys.executable, "-m", "pyinstrument", "-r", "session", "-o", str(out), "-m", module, *args]


def render_profiles(profile_dir: Path) -> None:
    """Each ``<name>.pyisession`` left by a profiled child as ``<name>.txt`` (the call tree) and
    ``<name>-flat.txt`` (functions by their own time: where to cut first)."""
    for session in sorted(profile_dir.rglob("*.pyisession")):
        for suffix, options in ((".txt", ["--show-all"]), ("-flat.txt", ["-p", "flat", "-p", "show_all"])):
            out = session.with_name(session.stem + suffix)
            subprocess.run([sys.executable, "-m", "pyinstrument", f"--load={session}", "-r", "text", *options,
                            "-o", str(out)], check=False, capture_output=True, timeout=300)


def tail_text(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Proc:
    """One child. ``protocol=True``: a bench worker (JSON lines on stdout, commands on stdin)."""

    def __init__(self, name: str, module: str, args: list[str], workdir: Path, *,
                 protocol: bool = True, profile_dir: Path | None = None) -> None:
        self.name = name
        self.profiled = profile_dir is not None  # pyinstrument writes its report on exit: wait longer
        self.log_path = workdir / f"{name}.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.popen = subprocess.Popen(
            _python(module, args, name, profile_dir),
            stdin=subprocess.PIPE if protocol else subprocess.DEVNULL,
            stdout=subprocess.PIPE if protocol else self._log,
            stderr=self._log,
            env=env,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.count = 0  # the latest "progress" count
        self.count_at = 0.0  # and when the worker counted it (its wall clock, s)
        self.done: dict[str, Any] | None = None
        self._reader: threading.Thread | None = None
        if protocol:
            self._reader = threading.Thread(target=self._read, name=f"bench-{name}", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # not ours (a library printing to stdout)
            if event.get("event") == "progress":
                self.count, self.count_at = int(event["count"]), float(event.get("at") or time.time())
                continue
            if event.get("event") == "done":
                self.done = event
                if "count" in event:
                    self.count, self.count_at = int(event["count"]), float(event.get("at") or time.time())
            self.events.put(event)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def fail(self, what: str) -> BenchError:
        code = self.popen.poll()
        state = "running" if code is None else f"exited with {code}"
        return BenchError(f"{self.name} ({state}): {what}\n--- {self.log_path}\n{tail_text(self.log_path)}")

    def send(self, **cmd: Any) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(orjson.dumps(cmd) + b"\n")
            self.popen.stdin.flush()
        except BrokenPipeError as exc:
            raise self.fail(f"cannot send {cmd}") from exc

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail(f"no {name!r} within {timeout:.0f}s")
            try:
                event = self.events.get(timeout=min(left, 0.2))
            except queue.Empty:
                if not self.alive() and self.events.empty():
                    if self._reader is not None:
                        self._reader.join(1)
                    if self.events.empty():
                        raise self.fail(f"died before {name!r}") from None
                continue
            if event.get("event") == name:
                return event

    def stop(self, timeout: float = 30.0) -> dict[str, Any] | None:
        """SIGTERM, then wait for the exit (a worker reports ``done`` first); kill if stuck."""
        if self.profiled:
            timeout *= 4
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.popen.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.popen.stdin.close()
        self._log.close()
        return self.done

    def exit(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """For producing workers: ``exit`` command, then wait (it flushes first)."""
        if self.alive():
            with contextlib.suppress(BenchError):
                self.send(cmd="exit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        return self.stop(5)


def worker(role: str, config: dict[str, Any], workdir: Path, name: str | None = None,
           profile_dir: Path | None = None) -> Proc:
    return Proc(name or role, "broker.bench.workers", [role, orjson.dumps(config).decode()], workdir,
                profile_dir=profile_dir)


def acker(bootstrap: str, namespace: str, workdir: Path, *, commit_interval_ms: int = 100,
          profile_dir: Path | None = None) -> Proc:
    """The acker service exactly as deployed: ``python -m broker.cli acker`` (as broker.demo)."""
    args = ["acker", "--bootstrap", bootstrap, "--namespace", namespace,
            "--instance-id", f"{namespace}-acker", "--commit-interval-ms", str(commit_interval_ms)]
    return Proc("acker", "broker.cli", args, workdir, protocol=False, profile_dir=profile_dir)


def wait_until(predicate: Any, timeout: float, procs: list[Proc], what: str,
               on_tick: Any = None) -> None:
    """Poll ``predicate()`` until true; fail early when one of ``procs`` dies."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                             + "\n".join(f"--- {p.log_path}\n{tail_text(p.log_path, 8)}" for p in procs))
        for p in procs:
            if not p.alive():
                raise p.fail(f"died while waiting for {what}")
        if on_tick is not None:
            on_tick()
        time.sleep(0.05)
