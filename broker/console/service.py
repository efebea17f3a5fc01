"""The console as a service of an ``App`` (``replaybroker run MODULE:app --role console``):
``run()`` serves until ``stop()``, like the acker and the tasks."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from broker.console.auth import Authenticator, check_bind, load_tokens
from broker.console.server import Server, build
from broker.settings import KafkaSettings
from broker.topics import Namespace, check


@dataclass(frozen=True)
class ConsoleConfig:
    port: int = 8080
    bind: str = "127.0.0.1"
    tokens_file: str | None = None  # else $REPLAYBROKER_CONSOLE_TOKENS; none: loopback only
    index: str | None = None  # the SQLite index of NS.dlq (default: NS.console.sqlite here)
    sample_every_s: float = 10.0


class ConsoleService:
    def __init__(self, settings: KafkaSettings, ns: Namespace, config: ConsoleConfig | None = None) -> None:
        self.settings, self.ns, self.config = settings, ns, config or ConsoleConfig()
        # Bad tokens or a bind refused without them fail here, when the role is built; the
        # port is taken only when it runs (a role is built once more to check it exists).
        self.auth = Authenticator(load_tokens(self.config.tokens_file))
        check_bind(self.config.bind, self.auth)
        self.server: Server | None = None
        self.serving = threading.Event()
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        """The port it serves on, once ``serving`` is set."""
        assert self.server is not None, "the console is not running"
        return self.server.port

    def check_before_run(self) -> None:
        check(self.settings, self.ns)

    def run(self) -> None:
        self.server = build(
            self.settings, self.ns.name, self.auth, index_path=Path(self.config.index or f"{self.ns.name}.console.sqlite"),
            bind=self.config.bind, port=self.config.port, sample_every_s=self.config.sample_every_s,
        )
        self.server.start()
        self.serving.set()
        try:
            self._stopped.wait()
        finally:
            self.server.stop()

    def stop(self) -> None:
        self._stopped.set()
