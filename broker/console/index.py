"""The console's index of ``ns.dlq``: SQLite, filled by tailing the topic, rebuilt from it.

The topic stays the truth: the index holds where it has read to per partition, in the same
SQLite transaction as the entries it read, so a console restarted goes on from there and a
deleted index file is rebuilt by reading the topic again. Redrive markers and runs
(``ns.dlq.redriven``) are indexed beside the entries, so a page shows what was redriven, and
so is the audit log (``ns.console.audit``), so its page and a restarted console's redrive
runs read the index, not the topic.

A page is a keyset query (newest first: ``at_ms``, then partition and offset, descending)
over indexes that cover each filter, so its cost does not grow with the entries before it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.dlq import RECORD, DlqEntry, Marker

#: The bytes of a value kept for its preview; the size is kept whole.
VALUE_CAP = 16 * 1024
PAGE = 50
WALK = 2000  # matches above which a page walks the time index (Index.page)
_TOP = "\U0010ffff"  # greater than every character: the end of a prefix's range

SCHEMA = """
CREATE TABLE IF NOT EXISTS entry (
    part INTEGER NOT NULL, off INTEGER NOT NULL, at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL, reason TEXT NOT NULL, topic TEXT, key BLOB, origin TEXT,
    attempts INTEGER, history TEXT NOT NULL, headers TEXT NOT NULL, value BLOB,
    value_size INTEGER, marker_key BLOB, source TEXT,
    PRIMARY KEY (part, off)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entry_at ON entry (kind, at_ms DESC, part DESC, off DESC);
CREATE INDEX IF NOT EXISTS entry_topic ON entry (topic, at_ms DESC, part DESC, off DESC);
CREATE INDEX IF NOT EXISTS entry_key ON entry (key, at_ms DESC, part DESC, off DESC);
CREATE INDEX IF NOT EXISTS entry_reason ON entry (kind, reason);
CREATE INDEX IF NOT EXISTS entry_marker ON entry (marker_key);
CREATE TABLE IF NOT EXISTS header (
    part INTEGER NOT NULL, off INTEGER NOT NULL, name TEXT NOT NULL, value BLOB
);
CREATE INDEX IF NOT EXISTS header_value ON header (name, value, part, off);
CREATE INDEX IF NOT EXISTS header_entry ON header (part, off);
CREATE TABLE IF NOT EXISTS marker (
    marker_key BLOB PRIMARY KEY, new_srid TEXT NOT NULL, at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run (
    run_key BLOB PRIMARY KEY, body TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    part INTEGER NOT NULL, off INTEGER NOT NULL, at_ms INTEGER NOT NULL, action TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (part, off)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS audit_at ON audit (at_ms DESC, part DESC, off DESC);
CREATE INDEX IF NOT EXISTS audit_action ON audit (action, at_ms);
CREATE TABLE IF NOT EXISTS position (
    topic TEXT NOT NULL, part INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, part)
) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class Filter:
    """What the Dead letters page and a redrive plan select: all of what is given."""

    topic: str | None = None
    key: bytes | None = None
    reason_prefix: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    header_name: str | None = None
    header_value: bytes | None = None

    def as_json(self) -> dict[str, Any]:
        given = {
            "topic": self.topic,
            "key": None if self.key is None else self.key.decode("utf-8", "replace"),
            "reason_prefix": self.reason_prefix,
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
            "header_name": self.header_name,
            "header_value": None if self.header_value is None else self.header_value.decode("utf-8", "replace"),
        }
        return {k: v for k, v in given.items() if v is not None}

    def to_record(self) -> dict[str, Any]:
        """Every field, bytes as hex: ``from_record`` gives this filter back (``as_json`` is
        for reading and loses a key that is not UTF-8)."""
        return {
            "topic": self.topic, "key": None if self.key is None else self.key.hex(),
            "reason_prefix": self.reason_prefix, "since_ms": self.since_ms, "until_ms": self.until_ms,
            "header_name": self.header_name,
            "header_value": None if self.header_value is None else self.header_value.hex(),
        }

    @staticmethod
    def from_record(r: dict[str, Any]) -> Filter:
        def blob(v: Any) -> bytes | None:
            return None if v is None else bytes.fromhex(str(v))

        def ms(v: Any) -> int | None:
            return None if v is None else int(v)

        return Filter(r.get("topic"), blob(r.get("key")), r.get("reason_prefix"), ms(r.get("since_ms")),
                      ms(r.get("until_ms")), r.get("header_name"), blob(r.get("header_value")))


@dataclass(frozen=True)
class Selection:
    """What a redrive plan took, so that it can be taken again (a console restarted): the
    entries ``filter`` matched among those indexed then (``bound``: past the last offset
    indexed per partition of ``ns.dlq``) that were not redriven before ``at_ms``."""

    filter: Filter
    bound: dict[int, int]
    at_ms: int

    def to_record(self) -> dict[str, Any]:
        return {"filter": self.filter.to_record(), "bound": {str(p): o for p, o in self.bound.items()},
                "at_ms": self.at_ms}

    @staticmethod
    def from_record(r: dict[str, Any]) -> Selection:
        return Selection(Filter.from_record(r["filter"]), {int(p): int(o) for p, o in r["bound"].items()},
                         int(r["at_ms"]))


@dataclass
class EntryRow:
    part: int
    off: int
    at_ms: int
    kind: str
    reason: str
    topic: str | None
    key: bytes | None
    origin: int | None
    attempts: int | None
    history: list[dict[str, Any]]
    headers: list[tuple[str, bytes | None]]
    value: bytes | None
    value_size: int | None
    marker_key: bytes | None
    source: str | None
    redriven: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        return f"{self.part}@{self.off}"

    @property
    def value_cut(self) -> bool:
        return self.value is not None and self.value_size is not None and self.value_size > len(self.value)


@dataclass
class Page:
    rows: list[EntryRow]
    total: int
    next_cursor: str | None
    quarantined: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


def _headers_json(headers: Iterable[tuple[str, bytes | None]]) -> str:
    return orjson.dumps([[name, None if v is None else v.hex()] for name, v in headers]).decode()


def _row(r: sqlite3.Row) -> EntryRow:
    return EntryRow(
        part=r["part"], off=r["off"], at_ms=r["at_ms"], kind=r["kind"], reason=r["reason"], topic=r["topic"],
        key=r["key"], origin=None if r["origin"] is None else int(r["origin"]), attempts=r["attempts"],
        history=orjson.loads(r["history"]),
        headers=[(n, None if v is None else bytes.fromhex(v)) for n, v in orjson.loads(r["headers"])],
        value=r["value"], value_size=r["value_size"], marker_key=r["marker_key"], source=r["source"],
        redriven=None if r["new_srid"] is None else {"new_srid": int(r["new_srid"]), "at_ms": r["m_at_ms"]},
    )


def encode_cursor(row: EntryRow) -> str:
    return f"{row.at_ms}.{row.part}.{row.off}"


def _blob_cursor(text: str | None) -> bytes | None:
    if not text:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def decode_cursor(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    try:
        at, part, off = (int(x) for x in text.split("."))
    except ValueError:
        return None
    return at, part, off


class Index:
    """One SQLite file (or ``:memory:``); safe to use from the tailer and the request
    threads at once (one connection, one lock: SQLite serialises writers anyway)."""

    def __init__(self, path: str | Path, *, walk: int = WALK) -> None:
        self.path, self.walk = str(path), walk
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ------------------------------------------------------------------ writing

    def positions(self, topic: str) -> dict[int, int]:
        with self._lock:
            rows = self._db.execute("SELECT part, next_offset FROM position WHERE topic = ?", (topic,)).fetchall()
        return {r["part"]: r["next_offset"] for r in rows}

    def add(
        self,
        entries: Sequence[DlqEntry],
        markers: Sequence[tuple[bytes, Marker | None]] = (),
        positions: Iterable[tuple[str, int, int]] = (),
        runs: Sequence[tuple[bytes, dict[str, Any]]] = (),
        audits: Sequence[tuple[int, int, dict[str, Any]]] = (),
    ) -> None:
        """Entries, markers, redrive runs and audit events read, and where each topic was read
        to, in one transaction."""
        with self._tx() as db:
            for e in entries:
                value = None if e.value is None else e.value[:VALUE_CAP]
                db.execute(
                    "INSERT OR REPLACE INTO entry VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        e.partition, e.offset, e.timestamp_ms, e.kind, e.reason, e.topic, e.key,
                        None if e.origin is None else str(e.origin), e.attempts,
                        orjson.dumps([{"srid": f.srid, "attempt": f.attempt, "reason": f.reason, "at_ms": f.at_ms}
                                      for f in e.history]).decode(),
                        _headers_json(e.headers), value, None if e.value is None else len(e.value),
                        e.marker_key if e.kind == RECORD else None, e.source,
                    ),
                )
                db.execute("DELETE FROM header WHERE part = ? AND off = ?", (e.partition, e.offset))
                db.executemany(
                    "INSERT INTO header VALUES (?,?,?,?)", [(e.partition, e.offset, n, v) for n, v in e.headers]
                )
            for key, marker in markers:
                if marker is None:
                    db.execute("DELETE FROM marker WHERE marker_key = ?", (key,))
                else:
                    db.execute("INSERT OR REPLACE INTO marker VALUES (?,?,?)", (key, str(marker.new_srid), marker.at_ms))
            db.executemany("INSERT OR REPLACE INTO run VALUES (?,?)",
                           [(key, orjson.dumps(body).decode()) for key, body in runs])
            db.executemany("INSERT OR REPLACE INTO audit VALUES (?,?,?,?,?)",
                           [(part, off, int(e.get("at_ms") or 0), str(e.get("action", "")), orjson.dumps(e).decode())
                            for part, off, e in audits])
            db.executemany("INSERT OR REPLACE INTO position VALUES (?,?,?)", list(positions))

    # ------------------------------------------------------------------ reading

    def _where(self, f: Filter, kind: str | None, *, by_time: bool = False) -> tuple[str, list[Any]]:
        """The WHERE clause of ``f``. ``by_time``: written so that SQLite walks the time
        index and tests the reason and header per row (``+`` keeps it off their indexes) -
        the cheaper plan when they match many entries; else it starts from their indexes."""
        clauses: list[str] = []
        args: list[Any] = []
        if kind == RECORD:
            clauses.append("e.kind = 'record'")
        elif kind is not None:
            clauses.append("e.kind IN ('quarantine', 'unknown')")
        if f.topic:
            clauses.append("e.topic = ?")
            args.append(f.topic)
        if f.key is not None:
            clauses.append("e.key = ?")
            args.append(f.key)
        if f.reason_prefix:
            column = "+e.reason" if by_time else "e.reason"
            clauses.append(f"{column} >= ? AND {column} < ?")
            args += [f.reason_prefix, f.reason_prefix + _TOP]
        if f.since_ms is not None:
            clauses.append("e.at_ms >= ?")
            args.append(f.since_ms)
        if f.until_ms is not None:
            clauses.append("e.at_ms < ?")
            args.append(f.until_ms)
        if f.header_name:
            match = "h.name = ?" + ("" if f.header_value is None else " AND h.value = ?")
            args += [f.header_name] if f.header_value is None else [f.header_name, f.header_value]
            if by_time:
                clauses.append(f"EXISTS (SELECT 1 FROM header h WHERE h.part = e.part AND h.off = e.off AND {match})")
            else:
                clauses.append(f"(e.part, e.off) IN (SELECT h.part, h.off FROM header h WHERE {match})")
        return (" AND ".join(clauses) or "1"), args

    def page(self, f: Filter, *, kind: str | None = RECORD, cursor: str | None = None, size: int = PAGE) -> Page:
        """One page, newest first, after ``cursor`` (from the previous page).

        The count comes first and chooses the plan: a reason prefix or a header that matches
        more than ``walk`` entries is tested along the time index (a page then reads about
        ``size * all / matching`` entries); fewer are read from their own index and sorted."""
        where, args = self._where(f, kind)
        with self._lock:
            total = self._db.execute(f"SELECT count(*) FROM entry e WHERE {where}", args).fetchone()[0]
            quarantined = self._db.execute(
                "SELECT count(*) FROM entry WHERE kind IN ('quarantine', 'unknown')").fetchone()[0]
            if total > self.walk and (f.reason_prefix or f.header_name):
                where, args = self._where(f, kind, by_time=True)
            after = decode_cursor(cursor)
            if after is not None:
                # the bound on at_ms alone lets the time index start there
                where += " AND e.at_ms <= ? AND (e.at_ms, e.part, e.off) < (?, ?, ?)"
                args = [*args, after[0], *after]
            rows = self._db.execute(
                "SELECT e.*, m.new_srid AS new_srid, m.at_ms AS m_at_ms FROM entry e "
                f"LEFT JOIN marker m ON m.marker_key = e.marker_key WHERE {where} "
                "ORDER BY e.at_ms DESC, e.part DESC, e.off DESC LIMIT ?",
                (*args, size + 1),
            ).fetchall()
        out = [_row(r) for r in rows[:size]]
        return Page(out, total, encode_cursor(out[-1]) if len(rows) > size else None, quarantined)

    def get(self, part: int, off: int) -> EntryRow | None:
        with self._lock:
            r = self._db.execute(
                "SELECT e.*, m.new_srid AS new_srid, m.at_ms AS m_at_ms FROM entry e "
                "LEFT JOIN marker m ON m.marker_key = e.marker_key WHERE e.part = ? AND e.off = ?",
                (part, off),
            ).fetchone()
        return None if r is None else _row(r)

    def plan(self, f: Filter, sample: int = 10) -> tuple[list[bytes], dict[str, int], list[EntryRow], Selection]:
        """What a redrive of ``f`` takes: records not redriven yet -> (their marker keys,
        how many per data topic, the newest ``sample``, the selection that takes them again)."""
        with self._lock:
            bound = {r[0]: r[1] + 1 for r in self._db.execute("SELECT part, max(off) FROM entry GROUP BY part")}
            selection = Selection(f, bound, int(time.time() * 1000))
            taken = self.selected(selection)
        keys = [key for key, _, redriven in taken if not redriven]
        per_topic: dict[str, int] = {}
        for _, topic, redriven in taken:
            if not redriven:
                per_topic[topic] = per_topic.get(topic, 0) + 1
        page = self.page(f, size=sample)
        return keys, per_topic, [row for row in page.rows if row.redriven is None], selection

    def selected(self, s: Selection) -> list[tuple[bytes, str, bool]]:
        """The records ``s`` takes, newest first: (marker key, data topic, redriven since)."""
        where, args = self._where(s.filter, RECORD)
        bound = " OR ".join("(e.part = ? AND e.off < ?)" for _ in s.bound) or "0"
        args = [*args, *(x for p, o in sorted(s.bound.items()) for x in (p, o)), s.at_ms]
        with self._lock:
            rows = self._db.execute(
                "SELECT e.marker_key, e.topic, m.marker_key IS NOT NULL AS redriven FROM entry e "
                f"LEFT JOIN marker m ON m.marker_key = e.marker_key WHERE {where} AND ({bound}) "
                "AND (m.marker_key IS NULL OR m.at_ms >= ?) ORDER BY e.at_ms DESC, e.part DESC, e.off DESC",
                args,
            ).fetchall()
        return [(r["marker_key"], r["topic"], bool(r["redriven"])) for r in rows]

    def topics(self) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT topic FROM entry WHERE topic IS NOT NULL ORDER BY topic").fetchall()
        return [r[0] for r in rows]

    def runs(self, cursor: str | None = None, size: int = PAGE) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the redrive runs recorded in ``ns.dlq.redriven``, newest first, after
        ``cursor`` -> (runs, the next page's cursor)."""
        after = _blob_cursor(cursor)
        with self._lock:
            rows = self._db.execute(
                "SELECT run_key, body FROM run WHERE ? IS NULL OR run_key < ? ORDER BY run_key DESC LIMIT ?",
                (after, after, size + 1),
            ).fetchall()
        more = len(rows) > size
        return [orjson.loads(r["body"]) for r in rows[:size]], rows[size - 1]["run_key"].hex() if more else None

    def audit(self, cursor: str | None = None, size: int = 100) -> tuple[list[dict[str, Any]], int, str | None]:
        """A page of the audit log, newest first, after ``cursor`` -> (events, how many in
        all, the next page's cursor)."""
        after = decode_cursor(cursor)
        where, args = ("1", []) if after is None else (
            "at_ms <= ? AND (at_ms, part, off) < (?, ?, ?)", [after[0], *after])
        with self._lock:
            total = int(self._db.execute("SELECT count(*) FROM audit").fetchone()[0])
            rows = self._db.execute(
                f"SELECT part, off, at_ms, body FROM audit WHERE {where} ORDER BY at_ms DESC, part DESC, off DESC LIMIT ?",
                (*args, size + 1),
            ).fetchall()
        more = len(rows) > size
        last = rows[size - 1] if more else None
        return ([orjson.loads(r["body"]) for r in rows[:size]], total,
                f"{last['at_ms']}.{last['part']}.{last['off']}" if last is not None else None)

    def audited(self, actions: Sequence[str]) -> list[dict[str, Any]]:
        """The audit events of ``actions``, oldest first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT body FROM audit WHERE action IN ({','.join('?' for _ in actions)}) "
                "ORDER BY at_ms, part, off", list(actions),
            ).fetchall()
        return [orjson.loads(r["body"]) for r in rows]

    def runs_of(self, console_run: str) -> list[dict[str, Any]]:
        """The passes ``ns.dlq.redriven`` recorded for one console run, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM run ORDER BY run_key").fetchall()
        return [body for body in (orjson.loads(r["body"]) for r in rows) if body.get("console_run") == console_run]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM entry").fetchone()[0])

    def by_key(self, key: bytes, limit: int = 20) -> list[EntryRow]:
        return self.page(Filter(key=key), kind=None, size=limit).rows
