"""The embedded Kafka with authentication and authorization: a SASL_PLAINTEXT listener
(SCRAM-SHA-512), SCRAM users created at format time, the ``StandardAuthorizer`` with one
super user (``admin``) and ``allow.everyone.if.no.acl.found=false``: a principal may do only
what an ACL allows (``replaybroker topics acls``).

The controller listener uses SASL PLAIN with the admin's static credentials (KRaft keeps the
SCRAM credentials in its metadata, so the controller itself cannot authenticate with them).
It runs in its own run dir (``<home>/run/kafka-sasl``) and on its own ports, beside the
plaintext broker of ``replaybroker kafka up``.

``<run dir>/admin.env`` holds the admin's ``KAFKA_*`` variables (a ``.env`` for the CLI) and
``<run dir>/users.json`` every user's password; both are readable by the owner only.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from broker.dev import kafka_local
from broker.dev.maven import home, require_java
from broker.errors import LocalKafkaError

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"

SASL_PROPERTIES = """\
listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
listener.security.protocol.map={protocol}:{protocol},CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name={protocol}
sasl.enabled.mechanisms={mechanism}
sasl.mechanism.inter.broker.protocol={mechanism}
listener.name.{protocol_lower}.{mechanism_lower}.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required username="{admin}" password="{password}";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=\
org.apache.kafka.common.security.plain.PlainLoginModule required \
username="{admin}" password="{password}" user_{admin}="{password}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{admin}
allow.everyone.if.no.acl.found=false
"""


def default_sasl_run_dir() -> Path:
    return home() / "run" / "kafka-sasl"


def _secure_properties(plain: str, **values: Any) -> str:
    """The plaintext broker's properties with its listener lines replaced by the SASL ones."""
    replaced = ("listeners=", "advertised.listeners=", "listener.security.protocol.map=", "inter.broker.listener.name=")
    kept = [line for line in plain.splitlines() if not line.startswith(replaced)]
    return "\n".join(kept) + "\n" + SASL_PROPERTIES.format(**values)


# TLS (``tls=True``): a self-signed CA and a broker certificate for 127.0.0.1, made with the
# JDK's keytool in ``<run dir>/tls``; clients trust ``ca.pem``.
TLS_PROPERTIES = """\
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password={store_password}
ssl.key.password={store_password}
ssl.truststore.type=PKCS12
ssl.truststore.location={truststore}
ssl.truststore.password={store_password}
"""


def client_settings(bootstrap: str, user: str, password: str, ca_location: str | None = None) -> dict[str, str]:
    """The librdkafka connection of ``user`` on this broker (``ca_location``: over TLS)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL" if ca_location else "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
    }
    if ca_location:
        conf["ssl.ca.location"] = ca_location
    return conf


def make_tls(java: str, folder: Path, password: str) -> dict[str, str]:
    """CA, broker key and certificate (SAN IP 127.0.0.1, signed by the CA) with keytool."""
    keytool = str(Path(java).resolve().parent / "keytool")
    folder.mkdir(parents=True, exist_ok=True)
    ca, broker, trust = folder / "ca.p12", folder / "broker.p12", folder / "truststore.p12"
    ca_pem, csr, crt = folder / "ca.pem", folder / "broker.csr", folder / "broker.crt"
    common = ["-storetype", "PKCS12", "-storepass", password, "-keypass", password]

    def run(*args: str) -> None:
        done = subprocess.run([keytool, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LocalKafkaError(f"keytool {args[0]} failed: {done.stdout}{done.stderr}")

    run("-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
        "-dname", "CN=replaybroker-local-ca", "-ext", "bc:c", "-keystore", str(ca), *common)
    run("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), "-file", str(ca_pem), *common)
    run("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
        "-dname", "CN=127.0.0.1", "-keystore", str(broker), *common)
    run("-certreq", "-alias", "broker", "-keystore", str(broker), "-file", str(csr), *common)
    run("-gencert", "-alias", "ca", "-keystore", str(ca), "-infile", str(csr), "-outfile", str(crt),
        "-rfc", "-validity", "30", "-ext", "san=ip:127.0.0.1,dns:localhost", *common)
    run("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(broker), *common)
    run("-importcert", "-noprompt", "-alias", "broker", "-file", str(crt), "-keystore", str(broker), *common)
    run("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(trust), *common)
    return {"keystore": str(broker), "truststore": str(trust), "ca_pem": str(ca_pem)}


class SaslKafka(kafka_local.LocalKafka):
    """``LocalKafka`` with SCRAM users and ACLs. ``users`` maps user names to passwords (a
    password of ``None`` is generated); the super user ``admin`` is always created."""

    def __init__(self, run_dir: Path | str | None = None, *, users: Mapping[str, str | None] | None = None,
                 heap: str = "768m", tls: bool = False) -> None:
        super().__init__(run_dir or default_sasl_run_dir(), heap=heap)
        self.tls = tls
        wanted = {ADMIN: None, **(users or {})}
        self.passwords = {u: p or secrets.token_urlsafe(18) for u, p in wanted.items()}

    def start(self, *, detach: bool = False, attempts: int = 3) -> kafka_local.BrokerState:
        running = kafka_local.running_state(self.run_dir)
        if running is not None:
            self.passwords = json.loads((self.run_dir / "users.json").read_text())
        return super().start(detach=detach, attempts=attempts)

    @property
    def ca_location(self) -> str | None:
        """The CA clients trust over TLS (None without TLS)."""
        return str(self.run_dir / "tls" / "ca.pem") if self.tls else None

    def client_config(self, user: str = ADMIN) -> dict[str, str]:
        return client_settings(self.bootstrap, user, self.passwords[user], self.ca_location)

    def _start_once(self, version: str, jars: list[str], *, detach: bool) -> kafka_local.BrokerState:
        java = require_java()
        if self.run_dir.exists():
            import shutil

            shutil.rmtree(self.run_dir)
        data_dir = self.run_dir / "data"
        data_dir.mkdir(parents=True)
        port, controller_port = kafka_local.free_port(), kafka_local.free_port()
        while controller_port == port:
            controller_port = kafka_local.free_port()
        plain = kafka_local.SERVER_PROPERTIES.format(port=port, controller_port=controller_port, data_dir=data_dir)
        props = self.run_dir / "server.properties"
        protocol = "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        text = _secure_properties(
            plain, port=port, controller_port=controller_port, mechanism=MECHANISM, protocol=protocol,
            protocol_lower=protocol.lower(), mechanism_lower=MECHANISM.lower(), admin=ADMIN,
            password=self.passwords[ADMIN],
        )
        if self.tls:
            store_password = secrets.token_urlsafe(12)
            stores = make_tls(java, self.run_dir / "tls", store_password)
            text += TLS_PROPERTIES.format(store_password=store_password, **stores)
        props.write_text(text)
        props.chmod(0o600)
        log4j = self.run_dir / "log4j2.properties"
        log4j.write_text(kafka_local.LOG4J2_PROPERTIES.format(log_file=self.run_dir / "server.log", level="INFO"))
        jvm = [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC"]
        jvm += [f"-Dlog4j2.configurationFile={log4j}", "-cp", os.pathsep.join(jars)]
        cluster_id = uuid.uuid4().hex[:22]
        scram = [arg for user, password in self.passwords.items()
                 for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")]
        fmt = subprocess.run(
            [*jvm, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id, "-c", str(props), *scram],
            capture_output=True, text=True, check=False,
        )
        if fmt.returncode != 0:
            raise LocalKafkaError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        self._write_credentials(f"127.0.0.1:{port}")
        self._jvm, self._detach = jvm, detach
        self._launch()
        assert self.proc is not None
        state = kafka_local.BrokerState(
            pid=self.proc.pid, bootstrap=f"127.0.0.1:{port}", port=port, controller_port=controller_port,
            run_dir=str(self.run_dir), kafka_version=version, cluster_id=cluster_id, started_at=time.time(),
        )
        self._wait_ready(state)
        (self.run_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
        return state

    def _write_credentials(self, bootstrap: str) -> None:
        users = self.run_dir / "users.json"
        users.write_text(json.dumps(self.passwords, indent=2))
        env = self.run_dir / "admin.env"
        env.write_text(
            f"KAFKA_BOOTSTRAP_SERVERS={bootstrap}\n"
            f"KAFKA_SECURITY_PROTOCOL={'SASL_SSL' if self.tls else 'SASL_PLAINTEXT'}\n"
            + (f"KAFKA_SSL_CA_LOCATION={self.ca_location}\n" if self.tls else "")
            + f"KAFKA_SASL_MECHANISM={MECHANISM}\nKAFKA_SASL_USERNAME={ADMIN}\n"
            + f"KAFKA_SASL_PASSWORD={self.passwords[ADMIN]}\n"
        )
        for path in (users, env):
            path.chmod(0o600)

    def _wait_ready(self, state: kafka_local.BrokerState) -> None:
        assert self.proc is not None
        try:
            _wait_ready_sasl(self.proc, client_settings(state.bootstrap, ADMIN, self.passwords[ADMIN],
                                                        self.ca_location),
                             time.monotonic() + kafka_local.READY_TIMEOUT_S)
        except LocalKafkaError as exc:
            kafka_local._terminate(self.proc.pid)
            tail = kafka_local._tail(self.run_dir / "server.log") or kafka_local._tail(self.run_dir / "kafka.out")
            raise LocalKafkaError(f"{exc}; last log lines:\n{tail}") from exc


def _wait_ready_sasl(proc: subprocess.Popen[bytes], conf: Mapping[str, str], deadline: float) -> None:
    """Ready = the admin created and deleted a topic."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.kafka_log import client_logging

    # Failures are read with ``exception()``, never raised through this frame: a raised one
    # would tie the admin client into a reference cycle (future -> traceback -> this frame),
    # and a client freed by the cycle collector on one of librdkafka's own threads aborts the
    # process.
    admin = AdminClient({**conf, "socket.timeout.ms": 2000, **client_logging()})
    name = f"__replaybroker_ready_{uuid.uuid4().hex[:8]}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalKafkaError(f"Kafka exited with code {proc.returncode} during start-up")
        created = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=5)[name]
        try:
            failure = created.exception(timeout=10)
        except TimeoutError:
            failure = TimeoutError()
        if failure is None:
            admin.delete_topics([name], operation_timeout=5)[name].exception(timeout=10)
            return
        time.sleep(0.25)
    raise LocalKafkaError(f"Kafka did not become ready within {kafka_local.READY_TIMEOUT_S:.0f}s")


def main_up_sasl(run_dir: Path | None = None, users: Iterable[str] = (), *, tls: bool = False) -> int:
    """``replaybroker kafka up --sasl``: start detached; print the bootstrap, and where the
    admin's ``.env`` and the users' passwords are."""
    kafka = SaslKafka(run_dir, users=dict.fromkeys(users), tls=tls)
    state = kafka.start(detach=True)
    print(f"Kafka {state.kafka_version} with SASL/SCRAM{' over TLS' if tls else ''} and ACLs (pid {state.pid}); admin settings in "
          f"{kafka.run_dir / 'admin.env'}, passwords in {kafka.run_dir / 'users.json'}", file=sys.stderr)
    print(state.bootstrap)
    return 0
