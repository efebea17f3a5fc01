from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.session import build_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_spark_session(app_name="replaybroker-e2e")
    try:
        yield session
    finally:
        session.stop()
