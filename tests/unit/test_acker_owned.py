"""The owner of the acker's partition state (broker.acker.owned): what each of its writers
resets, and that no other part of the acker writes that state or takes more than six
collaborators."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import TopicPartition

from broker.acker.owned import OwnedPartitions
from broker.acker.replay import quarantine_record
from broker.acker.state import PartitionState
from broker.topics import Namespace

NS = Namespace("owned")
ACKER = Path(__file__).resolve().parents[2] / "broker" / "acker"


class Gate:
    """An expiry gate or a reading order: what it was told."""

    def __init__(self) -> None:
        self.assigned_tps: list[TopicPartition] = []
        self.forgotten: list[set[int]] = []

    def assigned(self, tps: Iterable[TopicPartition]) -> None:
        self.assigned_tps.extend(tps)

    def forget(self, lps: Iterable[int]) -> None:
        self.forgotten.append(set(lps))


def _owned(*lps: int) -> tuple[OwnedPartitions, Gate, Gate]:
    expiry, reading = Gate(), Gate()
    owned = OwnedPartitions(expiry, reading)  # type: ignore[arg-type]
    owned.install(
        {lp: owned.new_state() for lp in lps},
        [TopicPartition(t, lp, 10 * lp) for lp in lps for t in (NS.persist, NS.acks)],
    )
    return owned, expiry, reading


def _record(lp: int) -> object:
    return quarantine_record(NS, NS.acks, lp, 0, None, b"x", "bad")


def test_install_sets_positions_and_tells_the_expiry_gate() -> None:
    owned, expiry, _ = _owned(0, 1)
    assert set(owned.states) == {0, 1}
    assert owned.positions == {(NS.persist, 0): 0, (NS.acks, 0): 0, (NS.persist, 1): 10, (NS.acks, 1): 10}
    assert len(expiry.assigned_tps) == 4
    assert not owned.read


def test_drop_takes_the_state_positions_reads_and_outputs_of_its_partitions_only() -> None:
    owned, expiry, reading = _owned(0, 1, 2)
    owned.consumed(NS.acks, 0, 5)
    owned.consumed(NS.persist, 1, 12)
    owned.queue(0, _record(0))  # type: ignore[arg-type]
    owned.queue(1, _record(1))  # type: ignore[arg-type]
    kept = owned.states[2]
    dropped = owned.drop({0, 1})
    assert set(dropped) == {0, 1} and all(isinstance(st, PartitionState) for st in dropped.values())
    assert dict(owned.states) == {2: kept}
    assert owned.positions == {(NS.persist, 2): 20, (NS.acks, 2): 20}
    assert not owned.read
    assert not owned.outgoing
    assert expiry.forgotten == [{0, 1}] and reading.forgotten == [{0, 1}]


def test_outputs_of_a_partition_that_stays_survive_a_drop() -> None:
    owned, *_ = _owned(0, 1)
    owned.queue(1, _record(1))  # type: ignore[arg-type]
    owned.drop({0})
    assert [lp for lp, _ in owned.take_outgoing()] == [1]
    assert not owned.outgoing


def test_a_rewind_puts_back_the_totals_of_the_last_commit_in_the_same_dict() -> None:
    owned, *_ = _owned(0)
    totals = owned.totals
    owned.states[0].count("completed", 3)
    owned.committed(dict(owned.positions))
    owned.states[0].count("completed", 2)
    owned.states[0].count("dlq")
    assert totals["completed"] == 5 and totals["dlq"] == 1
    owned.rewind_totals()
    assert owned.totals is totals  # every state counts into this one
    assert totals["completed"] == 3 and totals["dlq"] == 0
    assert owned.committed_totals()["completed"] == 3


def test_a_commit_carries_the_positions_that_moved_or_were_touched_and_never_none() -> None:
    owned, *_ = _owned(0, 1)
    assert owned.moved_positions(set()) == dict(owned.positions)  # nothing committed yet: all moved
    owned.committed(owned.moved_positions(set()))
    assert owned.moved_positions(set()) == dict(owned.positions)  # none moved: all of them
    owned.consumed(NS.acks, 1, 17)
    assert owned.moved_positions(set()) == {(NS.acks, 1): 17}
    assert owned.moved_positions({0}) == {(NS.persist, 0): 0, (NS.acks, 0): 0, (NS.acks, 1): 17}


def test_take_read_empties_the_reads() -> None:
    owned, *_ = _owned(0, 1)
    owned.consumed(NS.persist, 0, 3)
    assert owned.take_read() == {0}
    assert not owned.read


def test_a_restored_partition_starts_unread() -> None:
    owned, *_ = _owned(0)
    owned.consumed(NS.acks, 0, 4)
    owned.drop({0})
    owned.install({0: owned.new_state()}, [TopicPartition(NS.acks, 0, 2)])
    assert not owned.read and owned.positions[(NS.acks, 0)] == 2


# ------------------------------------------------------------------ the structure

# The owner's fields, and what the parts were once handed of them.
OWNED_FIELDS = {"_states", "_positions", "_committed_positions", "_read", "_outgoing", "_committed_totals",
                "states", "positions", "read", "outgoing", "totals", "committed_totals"}
MUTATORS = {"clear", "update", "pop", "popitem", "append", "extend", "insert", "add", "discard", "remove",
            "difference_update", "setdefault"}
# Writes of the same names that are another owner's: a restore's own states and counts
# (broker.acker.restoring, the changelog's read jobs), a transaction's offsets, and a state
# counting into the totals it was made with.
OTHER_OWNERS = {
    ("changelog.py", "job.read"), ("unlogged.py", "job.read"), ("restoring.py", "head.states[lp]"),
    ("restoring.py", "head.read"), ("restoring.py", "p.states[lp]"), ("service.py", "batch.positions"),
    ("state.py", "self.totals[name]"),
}


def _writes_of_owned_state(tree: ast.AST) -> list[str]:
    """Writes in ``tree`` to the owner's fields, or to fields of the same names: an
    assignment, augmented assignment or deletion of them (or of an item of them), or a
    mutating call."""
    found = []

    def owned_target(node: ast.expr) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        return isinstance(node, ast.Attribute) and node.attr in OWNED_FIELDS

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        found += [ast.unparse(t) for t in targets if owned_target(t)]
    return found


def test_only_the_owner_writes_the_partition_state() -> None:
    offenders = {
        path.name: writes
        for path in sorted(ACKER.glob("*.py")) if path.name != "owned.py"
        if (writes := [w for w in _writes_of_owned_state(ast.parse(path.read_text()))
                       if (path.name, w) not in OTHER_OWNERS])
    }
    assert not offenders, offenders


def test_the_scan_finds_the_writes_the_parts_once_made() -> None:
    old = """
self.states.update(done.states)
self.read.difference_update(lps)
self.outgoing[:] = [(lp, rec) for lp, rec in self.outgoing if lp not in lps]
self.totals.clear()
del self.positions[tp]
x = self.states
"""
    assert sorted(_writes_of_owned_state(ast.parse(old))) == [
        "self.outgoing[:]", "self.positions[tp]", "self.read", "self.states", "self.totals"]


# Values a part is configured with, not collaborators: names, numbers, the configuration,
# the namespace and the tick arithmetic.
VALUES = {"str", "int", "float", "bool", "None", "Namespace", "AckerConfig", "Ticker", "KafkaSettings"}


def _collaborators(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs][1:]  # not self
    names = []
    for a in params:
        kinds = {n.id for n in ast.walk(a.annotation) if isinstance(n, ast.Name)} if a.annotation else {"?"}
        if not kinds <= VALUES:
            names.append(a.arg)
    return names


def _constructors(tree: ast.AST) -> dict[str, list[str]]:
    return {
        cls.name: _collaborators(fn)
        for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
        for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"
    }


def test_no_part_of_the_acker_takes_more_than_six_collaborators() -> None:
    crowded = {
        f"{path.name}:{name}": collaborators
        for path in sorted(ACKER.glob("*.py"))
        for name, collaborators in _constructors(ast.parse(path.read_text())).items()
        if len(collaborators) > 6
    }
    assert not crowded, crowded


def test_the_count_sees_collaborators_not_values() -> None:
    old = '''
class Assignment:
    def __init__(self, *, ns: Namespace, live: LiveClients, states: dict[int, PartitionState],
                 positions: dict[tuple[str, int], int], read: set[int], outgoing: list[tuple[int, Outgoing]],
                 changelog: ChangelogReader, restores: Restores, expiry: ExpiryGate, reading: ReadingOrder,
                 transactions: Transactions, commit: Callable[[], None], tick: int = 0,
                 config: AckerConfig | None = None) -> None: ...
'''
    assert len(_constructors(ast.parse(old))["Assignment"]) == 11
