"""The Kafka image's build context: the embedded broker's jars and configuration, with the
placeholders its entrypoint fills in - and nothing of the embedded broker's host or ports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.dev import kafka_image

ROOT = Path(__file__).resolve().parents[2]


def test_context_holds_the_jars_and_a_template_the_entrypoint_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jars = []
    for name in ("kafka_2.13-4.3.1.jar", "kafka-clients-4.3.1.jar"):
        jar = tmp_path / "m2" / name
        jar.parent.mkdir(exist_ok=True)
        jar.write_bytes(b"jar")
        jars.append(str(jar))
    monkeypatch.setattr(kafka_image, "kafka_classpath", lambda: ("4.3.1", jars))
    context = tmp_path / "context"
    context.mkdir()

    assert kafka_image.write_context(context) == "4.3.1"

    assert sorted(p.name for p in (context / "libs").iterdir()) == sorted(Path(j).name for j in jars)
    template = (context / "server.properties.in").read_text()
    assert "127.0.0.1" not in template
    assert f"log.dirs={kafka_image.DATA_DIR}" in template
    assert "listeners=PLAINTEXT://@HOST@:@PORT@,CONTROLLER://@HOST@:@CONTROLLER_PORT@" in template
    entrypoint = (ROOT / "docker" / "kafka" / "entrypoint.sh").read_text()
    filled = set(re.findall(r"s/(@\w+@)/", entrypoint))
    assert set(re.findall(r"@\w+@", template)) == filled == {"@HOST@", "@PORT@", "@CONTROLLER_PORT@"}
    assert (context / "VERSION").read_text().strip() == "4.3.1"
