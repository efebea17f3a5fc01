"""The console in a real browser (Debian's chromium, driven by Playwright) on a real Kafka: a
pipeline dead-letters records, some with HTML and script in key, value, headers and reason;
a viewer finds one by key and reason and traces it; an operator dry-runs a redrive, runs it at
a rate, cancels it, restarts the console and resumes the run there, and the records complete once each - ground truth from the
outcomes on the broker, not from what the console says. A viewer's redrive is refused, a POST
without the CSRF token too, and the hostile records do nothing on any page: no dialog, no
script run, no request to another origin."""

from __future__ import annotations

import gc
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.console.auth import Authenticator, parse_tokens
from broker.console.index import Filter, Index
from broker.console.kafka import Tailer, audit_topic
from broker.console.server import Server, build
from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWER, OPERATOR = "viewer-" + "v" * 24, "operator-" + "o" * 24
# Would run, load or call out if anything of it were taken as markup.
XSS = ('<script>window.__xss=1;alert(1)</script><img src="http://203.0.113.9/x.png" onerror="window.__xss=2">'
       '<svg onload="window.__xss=3"></svg>"\'><iframe src="javascript:alert(3)"></iframe>')
PLAIN = 8  # plain dead letters, keys cust-0 .. cust-7


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class Watch:
    """What a page did that it must not: dialogs, requests to another origin, page errors."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.dialogs: list[str] = []
        self.foreign: list[str] = []
        self.errors: list[str] = []

    def attach(self, page: Page) -> Page:
        def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", dialog)
        page.on("request", lambda r: None if r.url.startswith(self.origin) else self.foreign.append(r.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        return page


SHOTS = os.environ.get("REPLAYBROKER_SCREENSHOTS")  # a folder: the pages' screenshots go there


def shot(page: Page, name: str) -> None:
    """docs/operations.md's pictures: ``REPLAYBROKER_SCREENSHOTS=docs/images`` takes them."""
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"console-{name}.png"), full_page=True)


def context(browser: Browser, role: str, token: str) -> BrowserContext:
    return browser.new_context(http_credentials={"username": role, "password": token})


def wait_until(done: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_console_in_a_browser(bootstrap: str, browser: Browser, tmp_path: Path) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("con"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {topic: 2})
    accept = threading.Event()

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        if not accept.is_set() and (record.value or b"").startswith((b"bad", b"<")):
            ctx.reject(XSS if record.value == XSS.encode() else "cannot parse order")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=30_000, max_attempts=3))
    auth = Authenticator(parse_tokens(f"viewer={VIEWER},operator={OPERATOR}"))
    server: Server = build(settings, ns.name, auth, index_path=tmp_path / "index.sqlite", port=0, sample_every_s=1)
    try:
        good = [source.send(topic, f"good-{i}", f"fine {i}").origin for i in range(5)]
        bad = [source.send(topic, f"cust-{i}", f"bad order {i}").origin for i in range(PLAIN)]
        hostile = source.send(topic, XSS, XSS.encode(), [(XSS, XSS.encode()), ("tenant", b"acme")]).origin
        source.flush()
        dead = {*bad, hostile}
        services.wait(lambda: dead <= services.tail.log.dlq_origins(), "the dead letters")
        services.wait(lambda: set(good) <= services.tail.log.completed_origins().keys(), "the good records")
        server.start()
        base = f"http://127.0.0.1:{server.port}"
        wait_until(lambda: server.console.index.count() >= len(dead), "the index to catch up")
        watch = Watch(base)

        # ---- a viewer: every page, the hostile record shown as text; filters; a trace
        viewer = context(browser, "viewer", VIEWER)
        page = watch.attach(viewer.new_page())
        page.goto(f"{base}/dead-letters")
        assert page.locator("#total").inner_text() == str(len(dead))
        assert page.locator("td.key", has_text="<script>window.__xss=1").count() == 1  # as text
        page.fill("input[name=key]", "cust-3")
        page.fill("input[name=reason]", "rejected: cannot")
        page.click("button[type=submit]")
        assert page.locator("#total").inner_text() == "1"
        page.locator("tr.entry a").first.click()
        assert "cust-3" in page.locator("dd.key").inner_text()
        page.click("text=trace it")
        # the trace page reads the topics: wait for it instead of counting on the old page
        expect(page.locator("h2", has_text=f"origin {bad[3]}")).to_have_count(1, timeout=60_000)
        assert page.locator("svg.timeline circle.mark.dead-lettered").count() == 1
        assert page.locator("svg.timeline circle.mark.created").count() >= 1
        page.goto(f"{base}/dead-letters?header=tenant&header_value=acme")
        assert page.locator("#total").inner_text() == "1"
        hostile_link = page.locator("tr.entry a").first.get_attribute("href")
        assert hostile_link is not None
        for path in ["/", "/dead-letters", hostile_link, "/quarantine", f"/trace?id={hostile}", "/redrive",
                     "/audit", "/trace?key=" + urllib.parse.quote(XSS)]:
            page.goto(base + path)
            assert page.evaluate("() => window.__xss") is None, path
        page.goto(base + hostile_link)
        assert XSS in page.locator("pre.payload").inner_text()
        assert page.locator("iframe, img, script").count() == 0

        # ---- refused: a viewer's redrive, an operator's POST without the CSRF token
        plan_form = {"csrf": "whatever", "reason": "rejected: cannot"}
        refused = page.request.post(f"{base}/redrive/plan", form=plan_form, headers={"Origin": base})
        assert refused.status == 403 and "operator role" in refused.text()
        operator = context(browser, "operator", OPERATOR)
        op = watch.attach(operator.new_page())
        op.goto(f"{base}/redrive")
        no_csrf = op.request.post(f"{base}/redrive/plan", form={"reason": "rejected: cannot"}, headers={"Origin": base})
        assert no_csrf.status == 403 and "CSRF" in no_csrf.text()

        # ---- the operator: dry run, confirm at a rate, cancel, resume
        op.fill("input[name=reason]", "rejected: cannot")
        op.fill("input[name=rate]", "1")
        op.click("#plan-form button[type=submit]")
        assert op.locator("#plan-count").inner_text() == str(PLAIN)  # the hostile one has another reason
        accept.set()
        with op.expect_navigation():
            op.click("#confirm-form button[type=submit]")
        # a POST answered by a redirect: reload only once its page is in (a reload while it
        # navigates finds no page)
        with op.expect_navigation():
            op.locator("tr.run form[action$=cancel] button").click()
        run = op.locator("tr.run").first

        def state() -> str:
            op.reload()
            return run.locator("td.state").inner_text()

        wait_until(lambda: state() == "cancelled", "the run to stop")
        done = int(run.locator("span.done").inner_text())
        assert 0 < done < PLAIN
        run_id = run.get_attribute("id")

        # ---- the console restarted: the run is restored from Kafka and resumed there
        server.stop()
        server = build(settings, ns.name, auth, index_path=tmp_path / "index.sqlite", port=0, sample_every_s=1)
        server.start()
        base = watch.origin = f"http://127.0.0.1:{server.port}"
        op.goto(f"{base}/redrive")
        run = op.locator(f"tr#{run_id}")

        def restored() -> str:
            op.reload()
            return run.locator("td.state").inner_text() if run.count() else ""

        wait_until(lambda: restored() == "cancelled", "the run restored by the new console")
        assert int(run.locator("span.done").inner_text()) == done
        with op.expect_navigation():
            run.locator("form[action$=resume] button").click()
        wait_until(lambda: state() == "completed", "the resumed run", limit_s=90)
        assert run.locator("span.done").inner_text() == str(PLAIN)
        services.wait(lambda: set(bad) <= services.tail.log.completed_origins().keys(), "the redriven records")
        services.tail.poll(0.5)
        completed = services.tail.log.completed_origins()
        assert all(completed[o] == 1 for o in bad)  # once each, cancel and resume notwithstanding
        assert hostile not in completed  # not in the plan, not redriven

        # ---- a data key's records, dead-lettered or not: its first attempt and its redrive
        page.goto(f"{base}/trace?" + urllib.parse.urlencode({"key": "cust-3", "topic": topic}))
        hits = page.locator("#key-records tr.hit")
        assert hits.count() == 2
        shot(page, "trace-key")
        assert {t.split(" ")[0] for t in hits.locator("td:nth-child(2)").all_inner_texts()} == {
            topic, topics.replay_topic(topic)}
        page.goto(f"{base}/trace?" + urllib.parse.urlencode({"key": "good-1", "topic": topic}))
        assert page.locator("#key-records tr.hit").count() == 1
        page.locator("#key-records tr.hit a").first.click()
        expect(page.locator("h2", has_text=f"origin {good[1]}")).to_have_count(1, timeout=60_000)
        assert "completed" in page.locator("table").last.inner_text()

        # ---- the audit log, in Kafka and on its page
        recorded = [m.value() for m in read_to_end(settings, audit_topic(ns), 1)]
        assert sum(b'"redrive start"' in v for v in recorded) == 1
        assert sum(b'"redrive cancel"' in v for v in recorded) == 1
        assert sum(b'"redrive resume"' in v for v in recorded) == 1
        op.goto(f"{base}/audit")
        shot(op, "audit")
        actions = op.locator("td.action").all_inner_texts()
        assert {"redrive dry run", "redrive start", "redrive cancel", "redrive resume"} <= set(actions)
        assert all(w.startswith("operator:") for w in op.locator("tr.event td:nth-child(2)").all_inner_texts())
        # the runs as ns.dlq.redriven records them: the cancelled pass and the one that finished
        def history() -> list[str]:
            op.goto(f"{base}/redrive")
            return op.locator("#history td.state").all_inner_texts()

        wait_until(lambda: sorted(history()) == ["cancelled", "completed"], "the runs' history")
        shot(op, "redrive")
        op.goto(f"{base}/quarantine")
        shot(op, "quarantine")

        # ---- the Overview: the acker, the records completed, from the console's own samples
        def overview() -> str:
            op.goto(f"{base}/")
            return op.locator("#ackers").inner_text() if op.locator("#ackers").count() else ""

        wait_until(lambda: overview().startswith("1 acker instance"), "the acker on the Overview")
        assert int(op.locator("#completed").inner_text()) >= len(good) + PLAIN
        assert op.locator("svg.chart").count() == 6

        assert watch.dialogs == [] and watch.foreign == [] and watch.errors == []

        # ---- the index is rebuilt from the topic alone: the same entries, the same marks
        fresh = Index(tmp_path / "rebuilt.sqlite")
        tailer = Tailer(settings, ns, fresh, refresh_s=0.5)
        tailer.start()
        try:
            wait_until(tailer.caught_up.is_set, "the rebuilt index")
            old, new = server.console.index.page(Filter(), size=100), fresh.page(Filter(), size=100)
            assert [(r.where, r.key, r.redriven) for r in new.rows] == [(r.where, r.key, r.redriven) for r in old.rows]
            assert len(fresh.runs()[0]) == 2
        finally:
            tailer.stop()
            fresh.close()
        operator.close()
        viewer.close()
    finally:
        server.stop()
        services.stop()
        source.close()
        del acker, task, source
        gc.collect()
    assert not services.errors
