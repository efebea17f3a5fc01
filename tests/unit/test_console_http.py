"""The console over HTTP, without Kafka (its index filled by hand, nothing started that
reads Kafka): who may do what, the CSRF and origin checks, the security headers, and every
byte of a hostile record escaped on every page."""

from __future__ import annotations

import base64
import http.client
import re
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from broker.console.auth import Authenticator, parse_tokens
from broker.console.index import Index
from broker.console.kafka import acker_member
from broker.console.server import CSP, Console, Server
from broker.settings import KafkaSettings
from broker.topics import Namespace
from tests.unit.console_data import XSS, hostile, quarantined, record


class Recorded:
    """The audit log, kept in a list (one partition, the offset its index)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def ensure_topic(self) -> None:
        pass

    def close(self) -> None:
        pass

    def record(self, who: str, action: str, what: dict[str, Any], result: str) -> tuple[int, int, dict[str, Any]]:
        self.events.append({"at_ms": 1, "who": who, "action": action, "what": what, "result": result})
        return 0, len(self.events) - 1, self.events[-1]


VIEWER, OPERATOR = "viewer-token-0123456789", "operator-token-0123456789"
PAGES = ["/", "/dead-letters", "/dead-letters/0/3", "/quarantine", "/trace", "/trace?key=" + urllib.parse.quote(XSS),
         "/redrive", "/dead-letters?key=" + urllib.parse.quote(XSS)]


@pytest.fixture
def server() -> Iterator[Server]:
    index = Index(":memory:")
    index.add([record(0), record(1), record(2), hostile(3), quarantined(4)])
    auth = Authenticator(parse_tokens(f"viewer={VIEWER},operator={OPERATOR}"))
    console = Console(KafkaSettings("127.0.0.1:1"), "ns", auth, index, audit=Recorded())
    srv = Server(console, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def call(srv: Server, method: str, path: str, *, role: str | None = "viewer", body: dict[str, str] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    h = dict(headers or {})
    if role is not None:
        token = VIEWER if role == "viewer" else OPERATOR
        h["Authorization"] = "Basic " + base64.b64encode(f"{role}:{token}".encode()).decode()
    data = None
    if body is not None:
        data = urllib.parse.urlencode(body)
        h["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, data, h)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    conn.close()
    return out


def csrf_of(srv: Server, role: str) -> str:
    principal = srv.console.auth.authenticate(
        f"Bearer {VIEWER if role == 'viewer' else OPERATOR}")
    assert principal is not None
    return srv.console.auth.csrf_token(principal)


def test_healthz_needs_no_credentials(server: Server) -> None:
    status, _, body = call(server, "GET", "/healthz", role=None)
    assert (status, body) == (200, "ok\n")


def test_pages_need_credentials(server: Server) -> None:
    status, headers, _ = call(server, "GET", "/dead-letters", role=None)
    assert status == 401 and headers["www-authenticate"].startswith("Basic ")
    status, _, _ = call(server, "GET", "/", role=None, headers={"Authorization": "Bearer nope-nope-nope-nope"})
    assert status == 401


def test_the_overview_shows_each_ackers_partitions_and_standby(server: Server) -> None:
    ns = Namespace("ns")
    members = [acker_member(ns, "ns.acker.a1+standby", None, "/10.0.0.1", [TopicPartition("ns.persist", p) for p in (0, 1)]),
               acker_member(ns, "ns.acker.a2", "ns.acker.a2", "/10.0.0.2", [TopicPartition("ns.persist", 2)])]
    assert [(m["instance"], m["owned"], m["standby"]) for m in members] == [("a1", 2, True), ("a2", 1, False)]
    server.console.sampler.samples.append((0.0, {
        "ledger_partitions": 3, "pending": 0, "pending_unknown_partitions": [], "oldest_pending_age_s": None,
        "completed": 0, "replayed": 0, "dlq": 0, "counters_age_s": 1, "outages": {}, "ackers": members}))
    _, _, body = call(server, "GET", "/")
    assert '2 acker instance(s) in ns.acker, <span id="standbys">1</span> keeping standbys' in body
    rows = re.findall(r'<tr class="acker">(.*?)</tr>', body)
    assert rows == ["<td>a1</td><td>/10.0.0.1</td><td>ns.persist: 2 </td><td>yes</td>",
                    "<td>a2</td><td>/10.0.0.2</td><td>ns.persist: 1 </td><td>no</td>"]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_escapes_a_hostile_record_and_sends_the_policy(server: Server, path: str) -> None:
    status, headers, body = call(server, "GET", path)
    assert status == 200, body
    assert headers["content-security-policy"] == CSP and "script-src" not in CSP and "default-src 'none'" in CSP
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert "<script" not in body.lower()
    assert "<img" not in body.lower()


def test_a_hostile_entry_shows_as_text(server: Server) -> None:
    _, _, body = call(server, "GET", "/dead-letters/0/3")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<script>" not in body and "<img src=x" not in body
    _, _, listing = call(server, "GET", "/dead-letters")
    assert "&lt;script&gt;" in listing and "<script>" not in listing


def test_the_dead_letters_page_pages_and_filters(server: Server) -> None:
    _, _, body = call(server, "GET", "/dead-letters?key=k1")
    assert '<span id="total">1</span>' in body
    _, _, body = call(server, "GET", "/dead-letters?key=" + urllib.parse.quote(XSS))
    assert '<span id="total">1</span>' in body


def test_a_viewer_cannot_redrive(server: Server) -> None:
    status, _, body = call(server, "POST", "/redrive/plan", role="viewer",
                           body={"csrf": csrf_of(server, "viewer")}, headers={"Origin": f"http://127.0.0.1:{server.port}"})
    assert status == 403 and "operator role" in body


@pytest.mark.parametrize("path", ["/redrive/plan", "/redrive/confirm", "/redrive/abc/cancel", "/redrive/abc/resume"])
def test_a_post_without_the_csrf_token_is_refused(server: Server, path: str) -> None:
    origin = {"Origin": f"http://127.0.0.1:{server.port}"}
    for form in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": csrf_of(server, "viewer")}):
        status, _, body = call(server, "POST", path, role="operator", body=form, headers=origin)
        assert status == 403 and "CSRF" in body


def test_a_post_from_another_origin_is_refused(server: Server) -> None:
    form = {"csrf": csrf_of(server, "operator")}
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {}):
        status, _, body = call(server, "POST", "/redrive/abc/cancel", role="operator", body=form, headers=headers)
        assert status == 403 and "Origin" in body


def test_a_post_must_be_a_form(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/redrive/abc/cancel", '{"csrf": "x"}', {
        "Authorization": f"Bearer {OPERATOR}", "Content-Type": "application/json",
        "Origin": f"http://127.0.0.1:{server.port}"})
    assert conn.getresponse().status == 415
    conn.close()


def test_an_operator_post_with_token_and_origin_reaches_the_action_and_the_audit(server: Server) -> None:
    status, _, body = call(server, "POST", "/redrive/abc/resume", role="operator",
                           body={"csrf": csrf_of(server, "operator")}, headers={"Sec-Fetch-Site": "same-origin"})
    assert status == 409 and "no redrive run" in body  # past the checks: the action itself answers
    events, _, _ = server.console.index.audit()
    assert events[0]["action"] == "redrive resume" and events[0]["result"].startswith("refused")
    assert events[0]["who"].startswith("operator:")
    status, _, body = call(server, "POST", "/redrive/plan", role="operator",
                           body={"csrf": csrf_of(server, "operator"), "key": XSS},
                           headers={"Origin": f"http://127.0.0.1:{server.port}"})
    assert status == 200 and 'id="plan-count">1<' in body and "<script>" not in body
    assert server.console.index.audit()[0][0]["action"] == "redrive dry run"
    _, _, audit = call(server, "GET", "/audit")
    assert "redrive dry run" in audit and "<script>" not in audit


def test_get_of_an_action_and_unknown_pages(server: Server) -> None:
    assert call(server, "GET", "/redrive/plan")[0] == 405
    assert call(server, "GET", "/nope")[0] == 404
    assert call(server, "GET", "/static/console.css", role=None)[0] == 200
    assert call(server, "GET", "/static/../server.py", role=None)[0] == 404


def test_without_tokens_only_a_loopback_host_is_served() -> None:
    index = Index(":memory:")
    srv = Server(Console(KafkaSettings("127.0.0.1:1"), "ns", Authenticator({}), index, audit=Recorded()), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        assert call(srv, "GET", "/dead-letters", role=None)[0] == 200
        status, _, body = call(srv, "GET", "/dead-letters", role=None, headers={"Host": "rebound.example:8080"})
        assert status == 403 and "loopback" in body
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def test_a_form_without_a_usable_length_is_refused(server: Server) -> None:
    for length in ("-5", "many"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.putrequest("POST", "/redrive/plan")
        conn.putheader("Authorization", f"Bearer {OPERATOR}")
        conn.putheader("Content-Type", "application/x-www-form-urlencoded")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        assert conn.getresponse().status == 400
        conn.close()
