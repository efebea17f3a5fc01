"""Every command that needs a cluster, pointed at an address where no Kafka answers, fails
like a command line tool: one line ``replaybroker: <what failed>: <why>`` naming the address,
no traceback and no librdkafka chatter, a non-zero exit - as soon as librdkafka knows
(refused, unresolvable), not after a wait for the cluster. ``-v`` shows the traceback. A
service (acker, task, bridge) waits for the cluster first, asking again with back-off for
``--wait-for-kafka-ms`` (a broker may be restarting), then fails the same way.

The subprocess timeout is a bound for a hung test, not the target (docs/design.md §9 has no
figure for it): the command returns once the address failed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

COMMANDS = [
    ["status", "--namespace", "ns"],
    ["acker", "--namespace", "ns", "--wait-for-kafka-ms", "0"],
    ["topics", "check", "--namespace", "ns"],
    ["dlq", "list", "--namespace", "ns"],
    ["task", "--namespace", "ns", "--handler", "json:dumps", "--topics", "t", "--group", "g", "--wait-for-kafka-ms", "0"],
    ["demo", "--records", "10"],
]


def closed_port() -> int:
    """A port nothing listens on: bound to port 0, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=60, check=False, env=env,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("where", ["refused", "unresolvable"])
def test_unreachable_cluster_is_one_line_naming_the_address(command: list[str], where: str) -> None:
    bootstrap = f"127.0.0.1:{closed_port()}" if where == "refused" else "no-such-host.invalid:9092"
    done = run_cli(*command, "--bootstrap", bootstrap)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) < 5, done.stderr
    assert lines[-1].startswith(f"replaybroker: cannot reach Kafka at {bootstrap}: "), done.stderr
    assert ("refused" if where == "refused" else "resolve") in lines[-1], done.stderr


@pytest.mark.parametrize("verbose", [["-v", "status"], ["status", "-v"]], ids=["before", "after"])
def test_verbose_shows_the_traceback(verbose: list[str]) -> None:
    done = run_cli(*verbose, "--namespace", "ns", "--bootstrap", f"127.0.0.1:{closed_port()}")
    assert done.returncode == 2
    assert "Traceback" in done.stderr


def test_a_service_waits_for_the_cluster_then_fails_with_the_one_line() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    done = run_cli("acker", "--namespace", "ns", "--bootstrap", bootstrap, "--wait-for-kafka-ms", "4000")
    assert time.monotonic() - started >= 3  # tried at 0, 1 and 3 s
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) < 5, done.stderr
    assert any("trying again for up to 4s" in line for line in lines), done.stderr
    assert lines[-1].startswith(f"replaybroker: cannot reach Kafka at {bootstrap}: "), done.stderr
