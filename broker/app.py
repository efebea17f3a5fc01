"""``App``: a pipeline written with one object (docs/pipelines.md).

An app is a namespace, its data topics, its tasks and its acker, declared once::

    app = App("shop", serde=JsonSerde())
    orders = app.topic("orders", partitions=4)
    enriched = app.topic("enriched", partitions=4)
    app.task("enrich", orders, enrich)
    app.task("leaf", enriched, leaf)
    app.acker()

and run in one of two ways: every role in this process (``with app.run_in_background():``,
or ``app.run()``), for development and tests; or one role per process in production
(``replaybroker run shop.pipeline:app --role task:enrich``, ``--role acker``). A source is
user code: ``app.source()`` is a ``Source`` with the app's settings and serdes.

The classes underneath (``Source``, ``Task``, ``Acker``) stay the lower-level API; an app
only builds them: its topics are named ``<namespace>.<name>``, each task reads its topics'
replay topics too, and one serde serves every topic that does not name its own.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigurationError
from broker.serde import BYTES, Serde
from broker.settings import KafkaSettings
from broker.topics import REPLAY_SUFFIX, Namespace, replay_topic

if TYPE_CHECKING:
    from broker.acker.config import AckerConfig
    from broker.acker.service import Acker
    from broker.console.service import ConsoleConfig, ConsoleService
    from broker.kafka_port import KafkaPort
    from broker.source import Source, SourceConfig
    from broker.task import Task, TaskConfig

Handler = Callable[..., Any]

ACKER = "acker"
TASK = "task:"
CONSOLE = "console"


class Topic(str):
    """A data topic of an app: its full name (``<namespace>.<name>``) - a ``str``, so every
    API that takes a topic name takes it - with its partition count (None: it must exist)
    and its serde (None: the app's)."""

    partitions: int | None
    serde: Serde | None

    def __new__(cls, name: str, partitions: int | None = None, serde: Serde | None = None) -> Topic:
        topic = super().__new__(cls, name)
        topic.partitions = partitions
        topic.serde = serde
        return topic

    @property
    def replay(self) -> str:
        """``<topic>.replay``, where its records are replayed."""
        return replay_topic(self)


class App:
    """A namespace and what runs in it: topics, tasks, the acker (see the module doc).

    ``bootstrap`` and the other connection settings come from ``KafkaSettings.from_env``:
    the argument, else ``KAFKA_BOOTSTRAP_SERVERS`` (and the other ``KAFKA_*`` variables) in
    the environment or ``env_file``; or pass ``settings`` whole. ``ledger_partitions`` is P
    of the namespace's own topics when the app creates them (docs/operations.md sizes it)."""

    def __init__(
        self,
        namespace: str | Namespace,
        *,
        bootstrap: str | None = None,
        settings: KafkaSettings | None = None,
        serde: Serde = BYTES,
        ledger_partitions: int = 4,
        env_file: str | None = ".env",
        kafka: KafkaPort | None = None,
    ) -> None:
        """``kafka``: the port every service of the app reaches Kafka through (default: each
        its own real clients)."""
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.kafka = kafka
        if ledger_partitions < 1:
            raise ConfigurationError(f"ledger_partitions must be at least 1, not {ledger_partitions}")
        self.serde = serde
        self.ledger_partitions = ledger_partitions
        self._bootstrap, self._env_file, self._settings = bootstrap, env_file, settings
        self.topics: dict[str, Topic] = {}
        self._tasks: dict[str, tuple[list[Topic], Handler, TaskConfig | None, dict[str, Any]]] = {}
        self._acker: tuple[AckerConfig | None, dict[str, Any]] | None = None
        self._console: tuple[ConsoleConfig | None, dict[str, Any]] | None = None
        self._stop = threading.Event()

    @property
    def settings(self) -> KafkaSettings:
        """The connection settings, read from the environment when first needed."""
        if self._settings is None:
            self._settings = KafkaSettings.from_env(self._bootstrap, env_file=self._env_file)
        return self._settings

    # ------------------------------------------------------------------ declaring

    def topic(self, name: str, partitions: int | None = None, *, serde: Serde | None = None) -> Topic:
        """The data topic ``<namespace>.<name>`` and its replay topic: created with
        ``partitions`` by ``setup`` when missing (None: they must exist), checked otherwise.
        ``serde``: its values' serde, for sources and tasks alike (default: the app's)."""
        if not name or "." in name or name.endswith(REPLAY_SUFFIX):
            raise ConfigurationError(f"topic {name!r}: a name within the namespace, without '.'")
        if partitions is not None and partitions < 1:
            raise ConfigurationError(f"topic {name!r}: partitions must be at least 1, not {partitions}")
        full = f"{self.ns.name}.{name}"
        known = self.topics.get(full)
        if known is not None and (known.partitions, known.serde) != (partitions, serde):
            raise ConfigurationError(f"topic {name!r} is declared already, with other settings")
        self.topics[full] = topic = known or Topic(full, partitions, serde)
        return topic

    def task(
        self, name: str, topics: str | Iterable[str], handler: Handler | None = None,
        config: TaskConfig | None = None, **options: Any,
    ) -> Any:
        """Declare the task ``name`` (its consumer group is ``<namespace>.<name>``): it reads
        ``topics`` and each one's replay topic, and calls ``handler(record, ctx)`` per input.
        ``options`` are ``TaskConfig`` fields (over ``config``). Without ``handler``, a
        decorator: ``@app.task("enrich", orders)``."""
        if handler is None:
            return lambda function: self.task(name, topics, function, config, **options)
        if name in self._tasks:
            raise ConfigurationError(f"task {name!r} is declared already")
        if not name or "." in name:
            raise ConfigurationError(f"task {name!r}: a name within the namespace, without '.'")
        inputs = [topics] if isinstance(topics, str) else list(topics)
        if not inputs:
            raise ConfigurationError(f"task {name!r} reads no topic")
        self._tasks[name] = ([self._declared(t) for t in inputs], handler, config, options)
        return handler

    def acker(self, config: AckerConfig | None = None, **options: Any) -> None:
        """Declare the acker role; ``options`` are ``AckerConfig`` fields (over ``config``)."""
        self._acker = (config, options)

    def console(self, config: ConsoleConfig | None = None, **options: Any) -> None:
        """Declare the console role (broker.console: the operator's pages, on ``port``);
        ``options`` are ``ConsoleConfig`` fields (over ``config``)."""
        self._console = (config, options)

    def _declared(self, topic: str) -> Topic:
        if isinstance(topic, Topic):
            return topic
        full = topic if topic.startswith(f"{self.ns.name}.") else f"{self.ns.name}.{topic}"
        found = self.topics.get(full)
        if found is None:
            raise ConfigurationError(f"topic {topic!r} is not declared: app.topic({topic!r}, partitions=...)")
        return found

    # ------------------------------------------------------------------ building

    def serdes(self) -> dict[str, Serde]:
        """Topic -> serde of the topics with one of their own (their replay topics too)."""
        serdes: dict[str, Serde] = {}
        for topic in self.topics.values():
            if topic.serde is not None:
                serdes[topic] = serdes[topic.replay] = topic.serde
        return serdes

    def setup(self) -> int:
        """Create the namespace's topics and the declared data topics that are missing, then
        check the whole layout (``TopologyError`` when it is off); returns P."""
        from broker.topics import check, create

        create(self.settings, self.ns, self.ledger_partitions,
               {t: t.partitions for t in self.topics.values() if t.partitions is not None})
        if self.kafka is not None:
            return self.kafka.check(self.ns, list(self.topics))
        return check(self.settings, self.ns, list(self.topics))

    def source(self, config: SourceConfig | None = None, *, transactional_id: str | None = None,
               **options: Any) -> Source:
        """A ``Source`` of this app (its settings, the app's serde and the topics' own);
        ``options`` are ``SourceConfig`` fields (over ``config``)."""
        from broker.source import Source, SourceConfig

        return Source(self.settings, self.ns, self._config(config or SourceConfig(serde=self.serde), options),
                      transactional_id=transactional_id, kafka=self.kafka)

    def _config(self, base: Any, options: dict[str, Any]) -> Any:
        """``base`` with ``options``, and the topics' serdes under its own."""
        options = dict(options)
        own = options.pop("serdes", {})
        return replace(base, **options, serdes={**self.serdes(), **base.serdes, **own})

    @property
    def roles(self) -> list[str]:
        """What can run: ``acker`` and ``console`` (when declared) and ``task:<name>`` per task."""
        return (([ACKER] if self._acker is not None else []) + [TASK + name for name in self._tasks]
                + ([CONSOLE] if self._console is not None else []))

    def service(self, role: str) -> Acker | Task | ConsoleService:
        """The service of ``role`` (see ``roles``), built, not started."""
        if role == ACKER and self._acker is not None:
            from broker.acker import Acker, AckerConfig

            acker_config, options = self._acker
            return Acker(self.settings, self.ns, replace(acker_config or AckerConfig(), **options), kafka=self.kafka)
        if role == CONSOLE and self._console is not None:
            from broker.console.service import ConsoleConfig, ConsoleService

            console_config, options = self._console
            return ConsoleService(self.settings, self.ns, replace(console_config or ConsoleConfig(), **options))
        if role.startswith(TASK) and role[len(TASK):] in self._tasks:
            from broker.task import Task, TaskConfig

            name = role[len(TASK):]
            topics, handler, task_config, options = self._tasks[name]
            config = self._config(task_config or TaskConfig(serde=self.serde), options)
            inputs = list(dict.fromkeys(name for t in topics for name in (t, t.replay)))
            return Task(self.settings, self.ns, inputs, f"{self.ns.name}.{name}", handler, config, kafka=self.kafka)
        raise ConfigurationError(f"no role {role!r} in this app; its roles: {', '.join(self.roles) or 'none'}")

    # ------------------------------------------------------------------ running

    @contextlib.contextmanager
    def run_in_background(self, roles: Iterable[str] | None = None) -> Iterator[App]:
        """Every role (or ``roles``) on threads of this process while the block runs; then a
        clean stop. Topics are set up first. An exception of a service is raised when the
        block is left (``BackgroundError``)."""
        with self._running(roles):
            yield self

    @contextlib.contextmanager
    def _running(self, roles: Iterable[str] | None) -> Iterator[list[threading.Thread]]:
        from broker.background import in_background

        services = {role: self.service(role) for role in (self.roles if roles is None else roles)}
        self.setup()
        with contextlib.ExitStack() as stack:
            threads = []
            for role, service in services.items():
                service.check_before_run()
                threads.append(stack.enter_context(in_background(role, service.run, service.stop)))
            yield threads

    def run(self, roles: Iterable[str] | None = None) -> None:
        """Run every role (or ``roles``) until ``stop()``, SIGTERM or Ctrl-C; then stop them
        cleanly (final commits). ``replaybroker run MODULE:app --role ROLE`` calls this with
        one role: a service process."""
        self._stop.clear()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self._stop.set())
        with self._running(roles) as threads:
            # A service that stopped on an error ends the run: leaving the block raises it.
            while not self._stop.wait(0.5) and all(thread.is_alive() for thread in threads):
                pass

    def stop(self) -> None:
        """End ``run()``."""
        self._stop.set()


__all__ = ["App", "Topic"]
