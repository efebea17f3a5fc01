"""The ledger table is composed, not inherited: its parts own their state, no private name
crosses a module of ``broker.ledger``, and ``LedgerTable`` keeps the methods its callers use."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from broker.ledger.table import LedgerTable

LEDGER = Path(__file__).resolve().parents[2] / "broker" / "ledger"
MODULES = sorted(LEDGER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("broker")
        for alias in node.names
        if alias.name.startswith("_") and alias.name != "__future__"
    ]
    assert private == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_ledger_class_derives_from_a_class_of_the_project(path: Path) -> None:
    tree = ast.parse(path.read_text())
    project = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("broker")
        for alias in node.names
    } | {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    bases = [
        (node.name, base.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in project
    ]
    assert bases == []


def test_the_facade_keeps_every_method_its_callers_use() -> None:
    used = {
        "fold", "register", "mark_failed", "take_failed", "take_late_completed", "touch", "expire", "due",
        "take_expired_counts", "defer", "deferred_due", "take_deferred", "watch", "watching", "take_superseded",
        "mark_superseded", "take_settled", "take_dirty", "restore", "remove", "unlogged_floor", "log_older",
        "drop_unlogged", "get", "entries", "pending", "hashtable", "capacity", "nbytes", "bytes_per_entry",
    }
    assert used <= set(dir(LedgerTable))


def test_parts_share_one_store() -> None:
    """A change one part makes is what the others see: a deferred entry counts for ``due``, a
    restored failed one goes to ``take_failed``, a restored watch is left out of ``pending``."""
    table = LedgerTable(8)
    table.defer(np.array([5]), np.array([7]), 3)
    assert table.due(3) == 1 and table.deferred_due(3) == 1
    table.restore(np.array([9, 11]), np.array([1, 2]), np.array([0x03, 0x20]), np.array([4, 2]),
                  np.array([100, 100]))
    assert table.take_failed().srids.tolist() == [9]
    assert table.pending() == (1, 7)
    assert table.watching() == 1
