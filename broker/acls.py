"""The least ACLs of each role of a namespace (docs/design.md §12).

Names come from ``Namespace`` and ``replay_topic``, never typed by hand. What each role needs:

- ``source``: writes ``ns.persist`` and its data topics (``DESCRIBE`` their replay topics,
  which ``Source`` checks), and its transactional id when it uses one;
- ``task``: reads its input topics and their replay topics with its group (and that group's
  configs: the consumer group protocol is told by them, its timeouts set there), writes
  ``ns.acks`` and its output (child) topics - and can NOT write ``ns.persist``: only a source
  starts a tree;
- ``acker``: reads ``ns.persist``, ``ns.acks`` and ``ns.ledger`` in the group ``ns.acker``
  and the groups ``ns.acker.*`` (PREFIXED: restore, standby and fetch), writes persist tombstones,
  ``ns.ledger``, ``ns.dlq`` and the replay topics, and owns the transactional ids
  ``ns.acker.*`` (PREFIXED: one per instance);
- ``bridge``: reads its one input topic with its group (``ns.bridge.<input>`` unless told),
  writes ``ns.persist``, its target topic (``DESCRIBE`` its replay topic) and ``ns.dlq``
  (quarantine), and owns the transactional ids ``ns.bridge.*`` (PREFIXED: one per instance;
  its input offsets commit in those transactions);
- ``console``: reads ``ns.dlq``, ``ns.dlq.redriven``, ``ns.persist``, ``ns.ledger``, its data
  topics and their replay topics (the index, the status, a trace, a data key's records - read
  in the key's hash partitions only), describes the group
  ``ns.acker``, creates, writes and reads its audit log ``ns.console.audit``; with
  ``redrive`` also what a redrive writes: ``ns.persist``, the replay topics and
  ``ns.dlq.redriven`` (created on the first run) under the transactional id
  ``ns.dlq-redrive``.

Every role checks the layout at start (``topics.check``): ``DESCRIBE`` on the namespace's
topics and ``DESCRIBE_CONFIGS`` on the compacted ones.

No rule reaches another namespace: every PREFIXED name ends in ``.``, which no namespace's
name contains (``topics.check_namespace_name``), so ``ns.acker.`` is no prefix of
``ns.ackerx.acker``. The names a user gives (data topics, a group, a transactional id) are
refused when they are a namespace's own - this one's or another's: its topics, the acker's
and the bridges' groups and transactional ids.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from broker.errors import ConfigurationError
from broker.kafka_io import kafka_errors
from broker.topics import NAMESPACE_NAME, REPLAY_SUFFIX, Namespace, replay_topic

if TYPE_CHECKING:
    from confluent_kafka.admin import AclBinding, AdminClient

    from broker.settings import KafkaSettings

Role = Literal["source", "task", "acker", "bridge", "console"]
ROLES: tuple[Role, ...] = ("source", "task", "acker", "bridge", "console")


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW rule for a principal: ``operation`` on the resource ``(type, name, pattern)``."""

    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID
    name: str
    pattern: str  # LITERAL or PREFIXED
    operation: str  # READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS

    def __str__(self) -> str:
        return f"ALLOW {self.operation:<16} {self.resource}:{self.pattern}:{self.name}"


def _topic(name: str, *operations: str) -> set[Acl]:
    return {Acl("TOPIC", name, "LITERAL", op) for op in operations}


def _layout_check(ns: Namespace) -> set[Acl]:
    acls = set().union(*(_topic(t, "DESCRIBE") for t in (*ns.ledger_topics, ns.dlq, ns.superseded)))
    return acls | _topic(ns.persist, "DESCRIBE_CONFIGS") | _topic(ns.ledger, "DESCRIBE_CONFIGS")


def acker_group_prefix(ns: Namespace) -> str:
    return f"{ns.name}.acker"


# The names within a namespace NS that belong to the broker itself, by what follows "NS.".
OWN_TOPIC_SUFFIXES = ("persist", "acks", "ledger", "dlq", "superseded", "dlq.redriven", "console.audit")
OWN_GROUP_PARTS = ("acker", "bridge")  # NS.acker, NS.acker.*, NS.bridge.*


def _namespace_of(name: str) -> tuple[str, str] | None:
    """``NS.REST`` -> (NS, REST) when NS can be a namespace's name."""
    ns, sep, rest = name.partition(".")
    return (ns, rest) if sep and NAMESPACE_NAME.fullmatch(ns) else None


def _data_topic(role: str, topic: str, verb: str) -> str:
    """``topic`` as a data topic of ``role``: never a namespace's own topic, this one's or
    another's, and never written as a replay topic (only the acker writes those)."""
    within = _namespace_of(topic)
    if within is not None and within[1] in OWN_TOPIC_SUFFIXES:
        raise ConfigurationError(f"a {role} does not {verb} {topic}: a topic of namespace {within[0]} itself")
    if verb != "read" and topic.endswith(REPLAY_SUFFIX):
        raise ConfigurationError(f"a {role} does not {verb} {topic}: only the acker writes replay topics")
    return topic


def _user_name(role: str, kind: str, name: str, ns: Namespace, allowed: str | None = None) -> str:
    """A group or transactional id given for ``role``: never one of a namespace's acker or
    bridges (``allowed``: the part of ``ns`` this role owns itself, e.g. a bridge's)."""
    within = _namespace_of(name)
    if within is None:
        return name
    owner, rest = within
    part = rest.partition(".")[0]
    if part in OWN_GROUP_PARTS and not (owner == ns.name and part == allowed and rest != part):
        raise ConfigurationError(f"a {role} does not use the {kind} {name}: it belongs to the {part} of namespace {owner}")
    return name


def role_acls(
    ns: Namespace,
    role: str,
    *,
    data_topics: Iterable[str] = (),
    inputs: Iterable[str] = (),
    outputs: Iterable[str] = (),
    group: str | None = None,
    transactional_id: str | None = None,
    redrive: bool = False,
) -> set[Acl]:
    """The ALLOW rules ``role`` needs in ``ns``; nothing else is allowed
    (``allow.everyone.if.no.acl.found=false``).

    ``data_topics``: the data topics a source writes, or whose replay topics an acker writes;
    ``inputs``/``outputs``/``group``: a task's, or a bridge's (one input; its output defaults
    to the bridge's default target); ``transactional_id``: a transactional source's;
    ``redrive``: a console that may redrive (else it only reads, and writes its audit log).
    """
    acls = _layout_check(ns)
    if role == "source":
        acls |= _topic(ns.persist, "WRITE")
        for topic in data_topics:
            acls |= _topic(_data_topic(role, topic, "write"), "WRITE") | _topic(replay_topic(topic), "DESCRIBE")
        if transactional_id:
            _user_name(role, "transactional id", transactional_id, ns)
            acls |= {Acl("TRANSACTIONAL_ID", transactional_id, "LITERAL", op) for op in ("WRITE", "DESCRIBE")}
    elif role == "task":
        if not group:
            raise ConfigurationError("the task role needs its consumer group (--group)")
        inputs = list(inputs)
        if not inputs:
            raise ConfigurationError("the task role needs its input topics (--input)")
        acls |= _topic(ns.acks, "WRITE") | _topic(ns.superseded, "READ")  # markers: skip superseded replays
        # READ on its group is also what the marker reader needs (broker.markers: it looks
        # up the coordinator of the task's group). Its configs: read to tell the consumer
        # group protocol, written for session and heartbeat timeouts given to the task.
        name = _user_name(role, "group", group, ns)
        acls |= {Acl("GROUP", name, "LITERAL", op) for op in ("READ", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")}
        for topic in inputs:
            acls |= _topic(_data_topic(role, topic, "read"), "READ") | _topic(replay_topic(topic), "READ")
        for topic in outputs:
            acls |= _topic(_data_topic(role, topic, "write"), "WRITE")
    elif role == "acker":
        acls |= _topic(ns.persist, "READ", "WRITE") | _topic(ns.acks, "READ", "WRITE") | _topic(ns.ledger, "READ", "WRITE")
        # ns.acks: superseded marks for the acker of a replay; ns.superseded: the markers
        acls |= _topic(ns.dlq, "WRITE") | _topic(ns.superseded, "WRITE")
        for topic in data_topics:
            acls |= _topic(_data_topic(role, topic, "replay"), "DESCRIBE") | _topic(replay_topic(topic), "WRITE")
        prefix = acker_group_prefix(ns)
        acls |= {Acl("GROUP", prefix, "LITERAL", "READ"), Acl("GROUP", f"{prefix}.", "PREFIXED", "READ")}
        # It sets its group's session timeout and heartbeat interval (consumer protocol).
        acls |= {Acl("GROUP", prefix, "LITERAL", op) for op in ("ALTER_CONFIGS", "DESCRIBE_CONFIGS")}
        acls |= {Acl("TRANSACTIONAL_ID", f"{prefix}.", "PREFIXED", op) for op in ("WRITE", "DESCRIBE")}
    elif role == "bridge":
        acls |= _bridge_acls(ns, list(inputs), list(outputs), group)
    elif role == "console":
        acls |= _console_acls(ns, list(data_topics), redrive)
    else:
        raise ConfigurationError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return acls


def _bridge_acls(ns: Namespace, inputs: list[str], outputs: list[str], group: str | None) -> set[Acl]:
    from broker.bridge import default_target

    if len(inputs) != 1:
        raise ConfigurationError("the bridge role needs its one input topic (--input)")
    if len(outputs) > 1:
        raise ConfigurationError("a bridge writes one target topic (--output)")
    source = _data_topic("bridge", inputs[0], "read")
    target = _data_topic("bridge", outputs[0] if outputs else default_target(source), "write")
    acls = _topic(source, "READ") | _topic(ns.persist, "WRITE") | _topic(ns.dlq, "WRITE")
    acls |= _topic(target, "WRITE") | _topic(replay_topic(target), "DESCRIBE")
    group = _user_name("bridge", "group", group or f"{ns.name}.bridge.{source}", ns, allowed="bridge")
    acls.add(Acl("GROUP", group, "LITERAL", "READ"))
    acls |= {Acl("TRANSACTIONAL_ID", f"{ns.name}.bridge.", "PREFIXED", op) for op in ("WRITE", "DESCRIBE")}
    return acls


def _console_acls(ns: Namespace, data_topics: list[str], redrive: bool) -> set[Acl]:
    marks, audit = f"{ns.dlq}.redriven", f"{ns.name}.console.audit"
    acls = _topic(ns.dlq, "READ") | _topic(ns.persist, "READ") | _topic(ns.ledger, "READ")
    acls |= _topic(marks, "DESCRIBE", "READ") | _topic(audit, "CREATE", "DESCRIBE", "READ", "WRITE")
    acls.add(Acl("GROUP", acker_group_prefix(ns), "LITERAL", "DESCRIBE"))
    # Its readers assign partitions and commit nothing; their group ids are named all the same.
    acls |= {Acl("GROUP", name, "LITERAL", "READ") for name in (f"{ns.name}.console", "replaybroker.read")}
    for topic in data_topics:
        acls |= _topic(_data_topic("console", topic, "read"), "DESCRIBE", "READ") | _topic(replay_topic(topic), "READ")
    if redrive:
        acls |= _topic(ns.persist, "WRITE") | _topic(marks, "CREATE", "WRITE")
        acls |= {Acl("TRANSACTIONAL_ID", f"{ns.name}.dlq-redrive", "LITERAL", op) for op in ("WRITE", "DESCRIBE")}
        for topic in data_topics:
            acls |= _topic(replay_topic(topic), "DESCRIBE", "WRITE")
    return acls


def render(principal: str, acls: Iterable[Acl]) -> list[str]:
    """One line per rule, sorted: what ``topics acls`` prints."""
    return [f"{principal} {acl}" for acl in sorted(acls)]


def check_principal(principal: str) -> str:
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise ConfigurationError(f"a principal is User:NAME, got {principal!r}")
    return principal


@kafka_errors("applying ACLs")
def apply(settings: KafkaSettings, principal: str, acls: Iterable[Acl], timeout_s: float = 30.0) -> int:
    """Create the rules (``AdminClient.create_acls``); existing ones are left as they are.
    Returns how many were sent."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    check_principal(principal)
    bindings = [
        AclBinding(
            ResourceType[acl.resource],
            acl.name,
            ResourcePatternType[acl.pattern],
            principal,
            "*",
            AclOperation[acl.operation],
            AclPermissionType.ALLOW,
        )
        for acl in sorted(acls)
    ]
    admin = AdminClient(settings.client_config())
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s * 2)
    _wait_in_effect(admin, principal, bindings, timeout_s)
    return len(bindings)


def _wait_in_effect(admin: AdminClient, principal: str, bindings: list[AclBinding], timeout_s: float) -> None:
    """Return once a broker's authorizer lists every binding. ``create_acls`` returns when
    the controller has committed them; a broker applies them from the metadata log a moment
    later, and a client that writes in between is refused (seen: TOPIC_AUTHORIZATION_FAILED
    on a topic the rule allows, right after ``apply``). The broker that answers is any one of
    the cluster: on several brokers another one may still be a moment behind."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    wanted = {_key(b) for b in bindings}
    every_rule_of = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ANY,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        listed = admin.describe_acls(every_rule_of, request_timeout=timeout_s).result(timeout=timeout_s * 2)
        missing = wanted - {_key(b) for b in listed}
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{len(missing)} ACLs of {principal} not in effect after {timeout_s:.0f} s: {sorted(missing)}")
        time.sleep(0.1)


def _key(binding: AclBinding) -> tuple[str, str, str, str, str]:
    return (
        binding.restype.name, binding.name, binding.resource_pattern_type.name,
        binding.operation.name, binding.permission_type.name,
    )
