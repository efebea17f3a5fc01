"""What the console's pages make of a record's bytes and of samples (broker.console.render)."""

from __future__ import annotations

from broker.console.render import environment, line_chart, parse_time, payload, text, timeline
from tests.unit.console_data import XSS


def test_payload_previews() -> None:
    assert payload(b'{"b":[1,2],"a":"x"}') == ("json", '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "x"\n}', False)
    assert payload(b"plain words") == ("text", "plain words", False)
    assert payload(b"\x00\x01\xff") == ("binary", "00 01 ff", False)
    assert payload(b"bell\x07") [0] == "binary"
    assert payload(None) == ("none", "(none)", False)
    kind, shown, cut = payload(b"x" * 10_000, 100)
    assert (kind, len(shown), cut) == ("text", 100, True)
    kind, shown, cut = payload(bytes(range(256)) * 40, 300)
    assert kind == "binary" and len(shown) <= 300 and cut
    assert text(b'{"a":  1}') == '{ "a": 1 }'


def test_every_template_escapes_even_strings() -> None:
    env = environment()
    assert env.from_string("{{ x }}").render(x=XSS) == (
        "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;&#34;&#39;&amp;")
    assert "<script>" not in env.from_string("{{ x|text }}").render(x=XSS.encode())


def test_times() -> None:
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time("yesterday") is None and parse_time("") is None


def test_line_chart_keeps_the_last_hour_scaled_to_its_top() -> None:
    chart = line_chart("x", [(0.0, 5.0), (3000.0, 10.0), (3600.0, 0.0)], now=4000.0)
    assert chart.top == 10.0 and chart.last == 0.0 and chart.path.count("L") == 1
    assert line_chart("x", [], now=1.0).path == ""


def test_timeline_places_attempts_in_time_order() -> None:
    result = {
        "attempts": [
            {"attempt": 1, "persisted": {"created_ms": 1000}, "decision": {"outcome": "replayed", "at_ms": 2000},
             "replay": None},
            {"attempt": 2, "persisted": {"created_ms": 2000}, "decision": None,
             "replay": {"topic": "t.replay", "at_ms": 2000}},
        ],
        "dlq": [{"reason": XSS, "at_ms": 3000}],
    }
    marks, spans, height, span = timeline(result)
    assert span == (1000, 3000)
    assert next(m.kind for m in sorted(marks, key=lambda m: m.x)) == "created"
    assert max(m.x for m in marks if m.kind == "dead-lettered") == max(m.x for m in marks)
    assert len(spans) == 3 and height > 0


def test_json_in_a_page_is_escaped_too() -> None:
    shown = environment().from_string("{{ x|json }}").render(x={"key": XSS})
    assert "<script>" not in shown and "&lt;script&gt;" in shown
