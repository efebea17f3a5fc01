"""Every command that needs a cluster, pointed at an address where no Kafka answers, fails
like a command line tool: one line ``replaybroker: <what failed>: <why>``, no traceback and
no librdkafka chatter, a non-zero exit, in seconds. ``-v`` shows the traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

COMMANDS = [
    ["status", "--namespace", "ns"],
    ["acker", "--namespace", "ns"],
    ["topics", "check", "--namespace", "ns"],
    ["dlq", "list", "--namespace", "ns"],
    ["task", "--namespace", "ns", "--handler", "json:dumps", "--topics", "t", "--group", "g"],
]


def closed_port() -> int:
    """A port nothing listens on: bound to port 0, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=60, check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_unreachable_cluster_is_one_line(command: list[str]) -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    done, seconds = run_cli(*command, "--bootstrap", bootstrap)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) < 5, done.stderr
    assert lines[-1].startswith("replaybroker: "), done.stderr
    assert bootstrap in lines[-1]
    assert seconds < 30


def test_verbose_shows_the_traceback() -> None:
    done, seconds = run_cli("-v", "status", "--namespace", "ns", "--bootstrap", f"127.0.0.1:{closed_port()}")
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert seconds < 30
