"""The least ACLs of each role of a namespace (docs/design.md §12).

Names come from ``Namespace`` and ``replay_topic``, never typed by hand. What each role needs:

- ``source``: writes ``ns.persist`` and its data topics (``DESCRIBE`` their replay topics,
  which ``Source`` checks), and its transactional id when it uses one;
- ``task``: reads its input topics and their replay topics with its group, writes
  ``ns.acks`` and its output (child) topics - and can NOT write ``ns.persist``: only a source
  starts a tree;
- ``acker``: reads ``ns.persist``, ``ns.acks`` and ``ns.ledger`` in the groups ``ns.acker*``
  (PREFIXED: the main group, restore, standby and fetch), writes persist tombstones,
  ``ns.ledger``, ``ns.dlq`` and the replay topics, and owns the transactional ids
  ``ns.acker.*`` (PREFIXED: one per instance);
- ``bridge``: reads its one input topic with its group (``ns.bridge.<input>`` unless told),
  writes ``ns.persist``, its target topic (``DESCRIBE`` its replay topic) and ``ns.dlq``
  (quarantine), and owns the transactional ids ``ns.bridge.*`` (PREFIXED: one per instance;
  its input offsets commit in those transactions).

Every role checks the layout at start (``topics.check``): ``DESCRIBE`` on the namespace's
topics and ``DESCRIBE_CONFIGS`` on the compacted ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from broker.errors import ConfigurationError
from broker.topics import Namespace, replay_topic

if TYPE_CHECKING:
    from confluent_kafka.admin import AclBinding, AdminClient

    from broker.settings import KafkaSettings

Role = Literal["source", "task", "acker", "bridge"]
ROLES: tuple[Role, ...] = ("source", "task", "acker", "bridge")


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


def role_acls(
    ns: Namespace,
    role: str,
    *,
    data_topics: Iterable[str] = (),
    inputs: Iterable[str] = (),
    outputs: Iterable[str] = (),
    group: str | None = None,
    transactional_id: str | None = None,
) -> set[Acl]:
    """The ALLOW rules ``role`` needs in ``ns``; nothing else is allowed
    (``allow.everyone.if.no.acl.found=false``).

    ``data_topics``: the data topics a source writes, or whose replay topics an acker writes;
    ``inputs``/``outputs``/``group``: a task's, or a bridge's (one input; its output defaults
    to the bridge's default target); ``transactional_id``: a transactional source's.
    """
    acls = _layout_check(ns)
    if role == "source":
        acls |= _topic(ns.persist, "WRITE")
        for topic in data_topics:
            acls |= _topic(topic, "WRITE") | _topic(replay_topic(topic), "DESCRIBE")
        if transactional_id:
            acls |= {Acl("TRANSACTIONAL_ID", transactional_id, "LITERAL", op) for op in ("WRITE", "DESCRIBE")}
    elif role == "task":
        if not group:
            raise ConfigurationError("the task role needs its consumer group (--group)")
        inputs = list(inputs)
        if not inputs:
            raise ConfigurationError("the task role needs its input topics (--input)")
        acls |= _topic(ns.acks, "WRITE") | _topic(ns.superseded, "READ")  # markers: skip superseded replays
        acls.add(Acl("GROUP", group, "LITERAL", "READ"))
        for topic in inputs:
            if topic in ns.ledger_topics or topic == ns.dlq:
                raise ConfigurationError(f"a task does not read {topic}")
            acls |= _topic(topic, "READ") | _topic(replay_topic(topic), "READ")
        for topic in outputs:
            if topic in ns.ledger_topics or topic == ns.dlq:
                raise ConfigurationError(f"a task does not write {topic}")
            acls |= _topic(topic, "WRITE")
    elif role == "acker":
        acls |= _topic(ns.persist, "READ", "WRITE") | _topic(ns.acks, "READ", "WRITE") | _topic(ns.ledger, "READ", "WRITE")
        # ns.acks: superseded marks for the acker of a replay; ns.superseded: the markers
        acls |= _topic(ns.dlq, "WRITE") | _topic(ns.superseded, "WRITE")
        for topic in data_topics:
            acls |= _topic(topic, "DESCRIBE") | _topic(replay_topic(topic), "WRITE")
        prefix = acker_group_prefix(ns)
        acls.add(Acl("GROUP", prefix, "PREFIXED", "READ"))
        # It sets its group's session timeout and heartbeat interval (consumer protocol).
        acls |= {Acl("GROUP", prefix, "LITERAL", op) for op in ("ALTER_CONFIGS", "DESCRIBE_CONFIGS")}
        acls |= {Acl("TRANSACTIONAL_ID", f"{prefix}.", "PREFIXED", op) for op in ("WRITE", "DESCRIBE")}
    elif role == "bridge":
        acls |= _bridge_acls(ns, list(inputs), list(outputs), group)
    else:
        raise ConfigurationError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return acls


def _bridge_acls(ns: Namespace, inputs: list[str], outputs: list[str], group: str | None) -> set[Acl]:
    from broker.bridge import default_target

    if len(inputs) != 1:
        raise ConfigurationError("the bridge role needs its one input topic (--input)")
    if len(outputs) > 1:
        raise ConfigurationError("a bridge writes one target topic (--output)")
    source = inputs[0]
    target = outputs[0] if outputs else default_target(source)
    for topic in (source, target):
        if topic in ns.ledger_topics or topic == ns.dlq:
            raise ConfigurationError(f"a bridge does not read or write {topic} as data")
    acls = _topic(source, "READ") | _topic(ns.persist, "WRITE") | _topic(ns.dlq, "WRITE")
    acls |= _topic(target, "WRITE") | _topic(replay_topic(target), "DESCRIBE")
    acls.add(Acl("GROUP", group or f"{ns.name}.bridge.{source}", "LITERAL", "READ"))
    acls |= {Acl("TRANSACTIONAL_ID", f"{ns.name}.bridge.", "PREFIXED", op) for op in ("WRITE", "DESCRIBE")}
    return acls


def render(principal: str, acls: Iterable[Acl]) -> list[str]:
    """One line per rule, sorted: what ``topics acls`` prints."""
    return [f"{principal} {acl}" for acl in sorted(acls)]


def check_principal(principal: str) -> str:
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise ConfigurationError(f"a principal is User:NAME, got {principal!r}")
    return principal


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
