"""``replaybroker partition`` as a user runs it: a subprocess, one index per line, published
vectors, and one-line errors (no traceback) for bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker.partitioning import PARTITIONERS, partition_keys

# Published vectors (docs/design.md §7): Kafka's Utils.murmur2 and Spark's hash().
MURMUR2 = {"21": -973932308, "foobar": -790332482}
SPARK_HASH = {"abc": 1322437556}

KEYS = ["21", "foobar", "abc", "a", "", " ", "-1", "é", "中文", "😀", "0123456789" * 5]


def run_cli(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "partition", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=60,
        check=False,
    )


def indices(result: subprocess.CompletedProcess[str]) -> list[int]:
    assert result.returncode == 0, result.stderr
    return [int(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("partitions", [1, 7, 16, 1000])
@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_cli_prints_partition_keys(partitioner: str, partitions: int) -> None:
    result = run_cli("--partitioner", partitioner, "--partitions", str(partitions), *KEYS)
    got = indices(result)
    assert got == partition_keys(partitioner, partitions, KEYS)
    assert len(got) == len(KEYS)
    assert all(0 <= i < partitions for i in got)


@pytest.mark.parametrize("partitions", [7, 16, 1000])
def test_cli_kafka_matches_published_murmur2(partitions: int) -> None:
    keys = list(MURMUR2)
    result = run_cli("--partitioner", "kafka", "--partitions", str(partitions), *keys)
    assert indices(result) == [(MURMUR2[k] & 0x7FFFFFFF) % partitions for k in keys]


def test_cli_kafka_vectors_by_hand() -> None:
    # (-973932308 & 0x7fffffff) = 1173551340; (-790332482 & 0x7fffffff) = 1357151166
    assert indices(run_cli("--partitions", "7", "21", "foobar")) == [
        1173551340 % 7,
        1357151166 % 7,
    ]


@pytest.mark.parametrize("partitions", [7, 16, 200])
def test_cli_spark_matches_published_hash(partitions: int) -> None:
    result = run_cli("--partitioner", "spark", "--partitions", str(partitions), "abc")
    assert indices(result) == [SPARK_HASH["abc"] % partitions]  # pmod of a positive hash


def test_cli_default_partitioner_is_kafka() -> None:
    assert indices(run_cli("--partitions", "16", *KEYS)) == partition_keys("kafka", 16, KEYS)


def test_cli_dash_keys_after_double_dash() -> None:
    assert indices(run_cli("--partitions", "16", "--", "-x", "--y")) == partition_keys(
        "kafka", 16, ["-x", "--y"]
    )


@pytest.mark.parametrize("bad", ["0", "-1"])
@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_cli_rejects_non_positive_partitions(partitioner: str, bad: str) -> None:
    result = run_cli("--partitioner", partitioner, "--partitions", bad, "abc")
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().endswith(f"argument --partitions: must be positive, got {bad}")


def test_cli_rejects_a_key_that_is_not_utf8() -> None:
    # The raw byte 0xff reaches Python as a lone surrogate ("\udcff").
    result = run_cli("--partitions", "7", "ok", os.fsencode("\udcff"))
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "not valid UTF-8" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--partitions", "x", "abc"], "not a whole number: 'x'"),
        (["--partitioner", "crc32", "--partitions", "3", "abc"], "invalid choice"),
        (["--partitions", "3"], "required: keys"),
        (["abc"], "required: --partitions"),
    ],
)
def test_cli_usage_errors(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr
