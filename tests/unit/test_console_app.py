"""The console as a role of an App (``replaybroker run MODULE:app --role console``)."""

from __future__ import annotations

import pytest

from broker.app import App
from broker.console.service import ConsoleConfig, ConsoleService
from broker.errors import ConfigurationError
from broker.settings import KafkaSettings


def test_a_declared_console_is_a_role() -> None:
    app = App("shop", settings=KafkaSettings("fake:9092"))
    app.acker()
    assert "console" not in app.roles
    with pytest.raises(ConfigurationError, match="no role 'console'"):
        app.service("console")
    app.console(ConsoleConfig(port=9999), index="shop.sqlite")
    assert app.roles == ["acker", "console"]
    service = app.service("console")
    assert isinstance(service, ConsoleService)
    assert (service.config.port, service.config.index, service.ns.name) == (9999, "shop.sqlite", "shop")
    assert service.server is None  # the port is taken only when it runs


def test_a_console_without_tokens_refuses_another_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAYBROKER_CONSOLE_TOKENS", raising=False)
    app = App("shop", settings=KafkaSettings("fake:9092"))
    app.console(bind="0.0.0.0")
    with pytest.raises(ConfigurationError, match="loopback only"):
        app.service("console")
    monkeypatch.setenv("REPLAYBROKER_CONSOLE_TOKENS", "viewer=" + "v" * 20)
    assert isinstance(app.service("console"), ConsoleService)
