"""The Docker engine, compose and the images for the ``containers`` tests.

No engine: the tests skip with one reason - except in CI (``CI=true``), where a missing engine
fails them (``.ci/bootstrap`` starts one). The images are (re)built by ``docker/build`` first:
cached, so seconds when nothing changed; the services image follows the code under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.dev.testing import docker_available

ROOT = Path(__file__).resolve().parents[2]


def _compose_command() -> list[str] | None:
    """``docker compose`` (v2) if the CLI has it, else ``docker-compose`` (v1), else None."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.fixture(scope="session")
def compose() -> list[str]:
    """The compose command, once the engine answers and every image is built."""
    missing = None
    if shutil.which("docker") is None or not docker_available():
        missing = "no Docker engine answers (as root: docker/engine start; DOCKER_HOST names another)"
    elif (command := _compose_command()) is None:
        missing = "no docker compose (Debian: apt-get install docker-compose)"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"containers tests in CI: {missing}")
        pytest.skip(missing)
    built = subprocess.run(
        [str(ROOT / "docker" / "build")], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
        capture_output=True, text=True, check=False,
    )
    assert built.returncode == 0, f"docker/build failed:\n{built.stderr[-3000:]}"
    return command
