"""The console role's least ACLs: read-only (and its audit log) unless redrive is enabled."""

from __future__ import annotations

import pytest

from broker.acls import Acl, role_acls
from broker.errors import ConfigurationError
from broker.topics import Namespace

NS = Namespace("shop")


def writes(acls: set[Acl]) -> set[str]:
    return {a.name for a in acls if a.resource == "TOPIC" and a.operation == "WRITE"}


def test_a_console_reads_and_writes_only_its_audit_log() -> None:
    acls = role_acls(NS, "console", data_topics=["shop.orders"])
    assert writes(acls) == {"shop.console.audit"}
    reads = {a.name for a in acls if a.operation == "READ" and a.resource == "TOPIC"}
    assert reads == {"shop.dlq", "shop.dlq.redriven", "shop.persist", "shop.ledger", "shop.orders",
                     "shop.orders.replay", "shop.console.audit"}
    assert Acl("GROUP", "shop.acker", "LITERAL", "DESCRIBE") in acls
    assert not any(a.resource == "TRANSACTIONAL_ID" for a in acls)


def test_a_console_that_redrives_writes_what_a_redrive_writes() -> None:
    acls = role_acls(NS, "console", data_topics=["shop.orders"], redrive=True)
    assert writes(acls) == {"shop.console.audit", "shop.persist", "shop.orders.replay", "shop.dlq.redriven"}
    assert {a.operation for a in acls if a.resource == "TRANSACTIONAL_ID"} == {"WRITE", "DESCRIBE"}
    assert {a.name for a in acls if a.resource == "TRANSACTIONAL_ID"} == {"shop.dlq-redrive"}


def test_the_audit_log_is_no_data_topic() -> None:
    with pytest.raises(ConfigurationError, match="a topic of namespace shop itself"):
        role_acls(NS, "source", data_topics=["shop.console.audit"])
