"""The package root: the names a pipeline is written with, imported on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import broker
import broker.errors

PIPELINE = {"Source", "SourceConfig", "Task", "TaskConfig", "TaskContext", "TaskRecord", "Acker", "AckerConfig",
            "KafkaSettings", "Namespace", "JsonSerde", "AvroSerde", "BytesSerde", "Serde"}


def test_the_root_exports_what_a_pipeline_is_written_with() -> None:
    assert set(broker.__all__) >= PIPELINE
    for name in broker.__all__:
        assert getattr(broker, name) is not None
    from broker import Acker, KafkaSettings, Source, Task

    assert (Source.__module__, Task.__module__, Acker.__module__, KafkaSettings.__module__) == (
        "broker.source.client", "broker.task.service", "broker.acker.service", "broker.settings")


def test_every_error_a_user_can_catch_is_exported() -> None:
    errors = {name for name, value in vars(broker.errors).items()
              if isinstance(value, type) and issubclass(value, broker.errors.ReplayBrokerError)}
    dev_only = {"LocalKafkaError", "LocalSparkError"}
    assert errors - dev_only <= set(broker.__all__)
    assert not dev_only & set(broker.__all__)


def test_nothing_internal_is_exported() -> None:
    for name in broker.__all__:
        if name != "__version__":
            assert getattr(broker, name).__module__.split(".")[1] in {"app", "source", "task", "acker", "settings",
                                                                      "topics", "errors", "serde", "bridge", "sending",
                                                                      "delivery", "retry"}
    with pytest.raises(AttributeError):
        _ = broker.PartitionState  # type: ignore[attr-defined]


def test_test_hooks_are_not_on_the_handlers_context() -> None:
    from broker import TaskContext

    assert not any("skip" in name for name in dir(TaskContext))
    assert "_unacked" not in TaskContext.__slots__  # broker.dev.faults.skip_ack works from outside


def test_the_spark_wrapper_has_no_fault_hook() -> None:
    import inspect

    from spark_jobs import acking

    assert "inject" not in inspect.signature(acking.Acking.__init__).parameters
    assert not hasattr(acking, "AckFault")


def test_importing_the_package_loads_no_kafka_client() -> None:
    code = "import sys, broker, broker.ids; print('confluent_kafka' in sys.modules, 'broker.task' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
