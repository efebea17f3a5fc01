"""The least ACLs of each role: what it needs to do its part, and nothing that would let it
break the guarantee (a task writing ns.persist would start trees nobody tracks)."""

from __future__ import annotations

import pytest

from broker.acls import ROLES, Acl, render, role_acls
from broker.errors import ConfigurationError
from broker.topics import Namespace

NS = Namespace("shop")


def writes(acls: set[Acl]) -> set[str]:
    return {a.name for a in acls if a.resource == "TOPIC" and a.operation == "WRITE"}


def reads(acls: set[Acl]) -> set[str]:
    return {a.name for a in acls if a.resource == "TOPIC" and a.operation == "READ"}


def test_source_writes_persist_and_data_only() -> None:
    acls = role_acls(NS, "source", data_topics=["orders"], transactional_id="shop.src")
    assert writes(acls) == {NS.persist, "orders"}
    assert reads(acls) == set()
    assert Acl("TRANSACTIONAL_ID", "shop.src", "LITERAL", "WRITE") in acls
    assert not {a for a in acls if a.resource == "GROUP"}


def test_source_without_transactions_owns_no_transactional_id() -> None:
    assert not {a for a in role_acls(NS, "source", data_topics=["orders"]) if a.resource == "TRANSACTIONAL_ID"}


def test_task_reads_inputs_writes_acks_and_outputs_never_persist() -> None:
    acls = role_acls(NS, "task", inputs=["orders"], outputs=["enriched"], group="enrich")
    assert reads(acls) == {"orders", "orders.replay", NS.superseded}  # markers: skip superseded replays
    assert writes(acls) == {NS.acks, "enriched"}
    assert NS.persist not in writes(acls)
    # its group: read, and its configs (the consumer group protocol's check, its timeouts)
    assert {a for a in acls if a.resource == "GROUP"} == {
        Acl("GROUP", "enrich", "LITERAL", op) for op in ("READ", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")
    }
    assert not {a for a in acls if a.resource == "TRANSACTIONAL_ID"}


@pytest.mark.parametrize("topic", [NS.persist, NS.ledger, NS.dlq, NS.acks, NS.superseded, "shop.dlq.redriven",
                                   "other.persist", "other.superseded", "orders.replay"])
def test_task_output_to_a_namespace_topic_is_refused(topic: str) -> None:
    with pytest.raises(ConfigurationError, match="does not write"):
        role_acls(NS, "task", inputs=["orders"], outputs=[topic], group="g")


@pytest.mark.parametrize("topic", [NS.persist, NS.ledger, NS.dlq, NS.acks, NS.superseded, "other.acks"])
def test_task_input_from_a_namespace_topic_is_refused(topic: str) -> None:
    with pytest.raises(ConfigurationError, match="does not read"):
        role_acls(NS, "task", inputs=[topic], group="g")


def test_task_needs_group_and_inputs() -> None:
    with pytest.raises(ConfigurationError, match="--group"):
        role_acls(NS, "task", inputs=["orders"])
    with pytest.raises(ConfigurationError, match="--input"):
        role_acls(NS, "task", group="g")


def test_acker_owns_its_prefixes_and_writes_replay_dlq_ledger_tombstones() -> None:
    acls = role_acls(NS, "acker", data_topics=["orders"])
    assert reads(acls) == {NS.persist, NS.acks, NS.ledger}
    # ns.acks: a superseded mark for the acker that owns a replay; ns.superseded: its marker
    assert writes(acls) == {NS.persist, NS.acks, NS.ledger, NS.dlq, NS.superseded, "orders.replay"}
    assert "orders" not in writes(acls)
    assert Acl("GROUP", "shop.acker", "LITERAL", "READ") in acls  # its group
    assert Acl("GROUP", "shop.acker.", "PREFIXED", "READ") in acls  # restore, standby, fetch
    assert Acl("GROUP", "shop.acker", "LITERAL", "ALTER_CONFIGS") in acls  # its session timeout
    assert Acl("TRANSACTIONAL_ID", "shop.acker.", "PREFIXED", "WRITE") in acls


@pytest.mark.parametrize("role", ["source", "task", "acker"])
def test_every_role_may_check_the_layout(role: str) -> None:
    acls = role_acls(NS, role, data_topics=["orders"], inputs=["orders"], group="g")
    for topic in (*NS.ledger_topics, NS.dlq):
        assert Acl("TOPIC", topic, "LITERAL", "DESCRIBE") in acls
    assert Acl("TOPIC", NS.persist, "LITERAL", "DESCRIBE_CONFIGS") in acls


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown role"):
        role_acls(NS, "admin")


def test_render_is_stable_and_names_the_principal() -> None:
    lines = render("User:t", role_acls(NS, "source", data_topics=["orders"]))
    assert lines == render("User:t", set(reversed(sorted(role_acls(NS, "source", data_topics=["orders"])))))
    assert all(line.startswith("User:t ALLOW ") for line in lines)


def test_bridge_reads_its_input_writes_persist_target_and_dlq_owns_its_transactional_ids() -> None:
    acls = role_acls(NS, "bridge", inputs=["clicks"])
    assert reads(acls) == {"clicks"}
    assert writes(acls) == {NS.persist, "clicks.guaranteed", NS.dlq}
    assert Acl("TOPIC", "clicks.guaranteed.replay", "LITERAL", "DESCRIBE") in acls
    assert {a for a in acls if a.resource == "GROUP"} == {Acl("GROUP", "shop.bridge.clicks", "LITERAL", "READ")}
    assert {a for a in acls if a.resource == "TRANSACTIONAL_ID"} == {
        Acl("TRANSACTIONAL_ID", "shop.bridge.", "PREFIXED", op) for op in ("WRITE", "DESCRIBE")
    }
    assert NS.acks not in writes(acls) and NS.ledger not in writes(acls)


def test_bridge_with_its_own_target_and_group() -> None:
    acls = role_acls(NS, "bridge", inputs=["clicks"], outputs=["events"], group="g1")
    assert writes(acls) == {NS.persist, "events", NS.dlq}
    assert Acl("GROUP", "g1", "LITERAL", "READ") in acls


@pytest.mark.parametrize("inputs, outputs", [([], []), (["a", "b"], []), (["a"], ["x", "y"]), ([NS.persist], [])])
def test_bridge_role_refuses_what_a_bridge_does_not_do(inputs: list[str], outputs: list[str]) -> None:
    with pytest.raises(ConfigurationError):
        role_acls(NS, "bridge", inputs=inputs, outputs=outputs)


@pytest.mark.parametrize("group", ["shop.acker", "shop.acker.restore", "shop.bridge.clicks", "other.acker"])
def test_a_task_cannot_take_the_group_of_an_acker_or_a_bridge(group: str) -> None:
    with pytest.raises(ConfigurationError, match="belongs to the"):
        role_acls(NS, "task", inputs=["orders"], group=group)


def test_groups_that_only_look_alike_are_a_task_s_own() -> None:
    for group in ("shop.ackerx", "shop.enrich", "acker", "shop-acker"):
        assert Acl("GROUP", group, "LITERAL", "READ") in role_acls(NS, "task", inputs=["orders"], group=group)


def test_a_bridge_takes_a_group_of_its_namespace_s_bridges_not_of_another() -> None:
    assert Acl("GROUP", "shop.bridge.x", "LITERAL", "READ") in role_acls(NS, "bridge", inputs=["c"], group="shop.bridge.x")
    for group in ("other.bridge.x", "shop.acker", "shop.bridge"):
        with pytest.raises(ConfigurationError, match="belongs to the"):
            role_acls(NS, "bridge", inputs=["c"], group=group)


def test_a_source_cannot_take_the_transactional_ids_of_an_acker() -> None:
    with pytest.raises(ConfigurationError, match="belongs to the acker"):
        role_acls(NS, "source", data_topics=["orders"], transactional_id="shop.acker.a1")


@pytest.mark.parametrize("role", ["source", "acker"])
def test_data_topics_of_a_source_or_an_acker_are_never_a_namespace_s_own(role: str) -> None:
    with pytest.raises(ConfigurationError, match="a topic of namespace other itself"):
        role_acls(NS, role, data_topics=["other.ledger"])


def test_no_prefixed_rule_of_one_namespace_matches_the_names_of_another() -> None:
    """Every PREFIXED rule ends in '.', which no namespace name holds: "shop.acker." is no
    prefix of the groups of a namespace "shop.ackerx" - such a name is refused."""
    rules = set().union(*(role_acls(NS, role, data_topics=["o"], inputs=["o"], group="g") for role in ROLES))
    prefixed = {a.name for a in rules if a.pattern == "PREFIXED"}
    assert prefixed == {"shop.acker.", "shop.bridge."}
    with pytest.raises(ConfigurationError, match="no '\\.'"):
        Namespace("shop.ackerx")
