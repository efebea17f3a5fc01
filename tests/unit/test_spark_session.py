"""What a cluster master gets from ``build_spark_session``: the interpreter rule for masters on
this machine, and the zip of the project's packages for the executors' Python workers."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from spark_jobs.session import PACKAGES, _loopback_master, package_zip


@pytest.mark.parametrize(
    ("master", "loopback"),
    [
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077", True),
        ("spark://127.0.0.1:7077,localhost:7078", True),  # standby masters
        ("spark://10.0.0.5:7077", False),
        ("spark://127.0.0.1:7077,10.0.0.5:7077", False),
        ("local[2]", False),
        ("yarn", False),
    ],
)
def test_a_master_is_on_this_machine_only_if_every_address_is_loopback(master: str, loopback: bool) -> None:
    assert _loopback_master(master) is loopback


def test_the_package_zip_holds_the_sources_and_schemas_without_bytecode(tmp_path: Path) -> None:
    path = package_zip(tmp_path / "dist")
    names = zipfile.ZipFile(path).namelist()
    assert path.name == "replaybroker.zip"
    assert {n.split("/")[0] for n in names} == set(PACKAGES)
    assert {"broker/__init__.py", "spark_jobs/session.py", "schemas/xor_batch.avsc"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
