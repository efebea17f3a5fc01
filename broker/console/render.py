"""Pages as HTML: Jinja2 with autoescape on for every template, and the pure helpers that
turn records and samples into what a page shows (previews, SVG charts, the trace timeline).

Every byte of a record is attacker-controlled: it reaches a page only as text through an
autoescaped ``{{ }}`` - never ``|safe``, never inside a ``<script>`` or a ``style`` - and
the Content-Security-Policy allows no script at all.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

HERE = Path(__file__).parent
PREVIEW_CAP = 4096  # characters of a payload shown


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["iso"] = iso
    env.filters["text"] = text
    env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True)
    env.globals["payload"] = payload
    return env


def iso(ms: int | float | None) -> str:
    if ms is None or ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def text(data: bytes | None, limit: int = 200) -> str:
    """One line for a list: UTF-8 when it is printable text, else hex."""
    if data is None:
        return "(none)"
    kind, shown, _ = payload(data, limit)
    return shown if kind != "json" else " ".join(shown.split())


def _printable(s: str) -> bool:
    return not any((c < " " and c not in "\t\n\r") or c == "\x7f" for c in s)


def payload(data: bytes | None, limit: int = PREVIEW_CAP) -> tuple[str, str, bool]:
    """(kind, text, cut): JSON pretty-printed, text as is, binary as hex - at most ``limit``
    characters."""
    if data is None:
        return "none", "(none)", False
    try:
        s = data.decode("utf-8")
    except UnicodeDecodeError:
        s = None
    kind = "binary"
    if s is not None and _printable(s):
        kind, shown = "text", s
        if s.lstrip()[:1] in ("{", "["):
            try:
                shown = json.dumps(json.loads(s), indent=2, ensure_ascii=False)
                kind = "json"
            except ValueError:
                pass
    else:
        hexed = data[: limit // 3 + 1].hex()
        shown = " ".join(hexed[i : i + 2] for i in range(0, len(hexed), 2))
    cut = len(shown) > limit
    return kind, shown[:limit], cut


def parse_time(value: str | None) -> int | None:
    """An ``<input type=datetime-local>`` (taken as UTC), ISO 8601 or epoch ms -> epoch ms."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


# --------------------------------------------------------------------------- charts


@dataclass(frozen=True)
class Chart:
    title: str
    path: str  # an SVG path of the line ("" without points)
    top: float  # the value at the chart's top
    last: float | None
    width: int
    height: int


def line_chart(title: str, points: list[tuple[float, float]], now: float, *, span_s: float = 3600.0,
               width: int = 360, height: int = 90) -> Chart:
    """The last ``span_s`` of ``points`` (time, value) as one polyline, scaled to its max."""
    shown = [(t, v) for t, v in points if now - t <= span_s]
    top = max((v for _, v in shown), default=0.0) or 1.0
    coords = []
    for t, v in shown:
        x = width * (1 - (now - t) / span_s)
        y = height - (v / top) * (height - 4) - 2
        coords.append(f"{x:.1f},{y:.1f}")
    path = ("M" + " L".join(coords)) if coords else ""
    return Chart(title, path, top, shown[-1][1] if shown else None, width, height)


@dataclass(frozen=True)
class TimelineMark:
    x: float
    y: float
    kind: str  # created, decided, replayed, dead-lettered
    label: str  # shown as a <title> (escaped like any text)


Timeline = tuple[list[TimelineMark], list[tuple[float, float, float]], int, tuple[int, int] | None]


def timeline(result: dict[str, Any], width: int = 760) -> Timeline:
    """A trace as marks on one time axis, one row per attempt: (marks, the attempts' spans
    as (y, x0, x1), height, the first and last time shown in epoch ms)."""
    events: list[tuple[int, int, str, str]] = []  # at_ms, row, kind, label
    for row, a in enumerate(result.get("attempts", [])):
        p, d, r = a.get("persisted"), a.get("decision"), a.get("replay")
        n = a.get("attempt") or "?"
        if p:
            events.append((p["created_ms"], row, "created", f"attempt {n} persisted {iso(p['created_ms'])}"))
        if r:
            events.append((r["at_ms"], row, "replayed", f"attempt {n} replayed to {r['topic']} {iso(r['at_ms'])}"))
        if d:
            events.append((d["at_ms"], row, "decided", f"attempt {n}: {d['outcome']} {iso(d['at_ms'])}"))
    rows = max(1, len(result.get("attempts", [])))
    for e in result.get("dlq", []):
        events.append((e["at_ms"], rows, "dead-lettered", f"dead-lettered: {e['reason']} {iso(e['at_ms'])}"))
    height = (rows + 1) * 28 + 40
    if not events:
        return [], [], height, None
    t0 = min(e[0] for e in events)
    t1 = max(e[0] for e in events)
    span = max(t1 - t0, 1)
    marks = [TimelineMark(20 + (width - 40) * (at - t0) / span, 20 + row * 28, kind, label) for at, row, kind, label in events]
    spans = []
    for row in range(rows + 1):
        xs = [m.x for m in marks if m.y == 20 + row * 28]
        if xs:
            spans.append((20.0 + row * 28, min(xs), max(xs)))
    return marks, spans, height, (t0, t1)
