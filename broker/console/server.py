"""The console's HTTP server: the standard library's threading server, pages rendered on the
server, no script. Each request: authenticate (``/healthz`` and ``/static`` excepted), then
for a POST the operator role, the CSRF token and the same-origin check, then the page with
the security headers of every answer.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from broker import trace as tracing
from broker.console.auth import Authenticator, Principal, check_bind, loopback_host, same_origin
from broker.console.index import Filter, Index
from broker.console.kafka import WAITS, Audit, AuditLog, Sampler, Tailer
from broker.console.render import HERE, environment, line_chart, parse_time, timeline
from broker.console.runs import Redrives, parse_rate, started
from broker.errors import ConfigurationError, ReplayBrokerError
from broker.settings import KafkaSettings
from broker.topics import Namespace

log = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make a browser send "Origin: null" on a POST
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
MAX_BODY = 64 * 1024
STATIC = {"console.css": "text/css; charset=utf-8"}
WORST = 10  # ledger partitions shown by pending
RUNS_PAGE = 20
KEY_WINDOW_S = 24 * 3600  # how far back a data key's records are looked for, unless told


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    form: dict[str, str]
    principal: Principal
    csrf: str
    headers: dict[str, str] = field(default_factory=dict)


class Console:
    """The state behind the pages: the index and its tailer, the samples, the redrives and
    the audit log of one namespace."""

    def __init__(self, settings: KafkaSettings, namespace: str, auth: Authenticator, index: Index, *,
                 sample_every_s: float = 10.0, audit: AuditLog | None = None) -> None:
        self.settings, self.ns, self.auth, self.index = settings, Namespace(namespace), auth, index
        self.tailer = Tailer(settings, self.ns, index)
        self.sampler = Sampler(settings, self.ns, every_s=sample_every_s)
        self.redrives = Redrives(settings, namespace, index)
        self.audit: AuditLog = audit or Audit(settings, self.ns)
        self.env = environment()
        self.runs_restored = threading.Event()
        self._stopping = threading.Event()
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("GET", re.compile(r"/"), self.overview),
            ("GET", re.compile(r"/dead-letters"), self.dead_letters),
            ("GET", re.compile(r"/dead-letters/(\d+)/(\d+)"), self.dead_letter),
            ("GET", re.compile(r"/quarantine"), self.quarantine),
            ("GET", re.compile(r"/trace"), self.trace),
            ("GET", re.compile(r"/redrive"), self.redrive_page),
            ("POST", re.compile(r"/redrive/plan"), self.redrive_plan),
            ("POST", re.compile(r"/redrive/confirm"), self.redrive_confirm),
            ("POST", re.compile(r"/redrive/([A-Za-z0-9_-]+)/cancel"), self.redrive_cancel),
            ("POST", re.compile(r"/redrive/([A-Za-z0-9_-]+)/resume"), self.redrive_resume),
            ("GET", re.compile(r"/audit"), self.audit_page),
        ]

    def start(self) -> None:
        self.audit.ensure_topic()
        self.tailer.start()
        self.sampler.start()
        self._stopping.clear()
        threading.Thread(target=self._restore_runs, name="console-restore", daemon=True).start()

    def _restore_runs(self) -> None:
        """The redrive runs of the consoles before, once the index has caught up with the
        audit log and the markers."""
        while not self.tailer.caught_up.wait(0.5):
            if self._stopping.is_set():
                return
        try:
            restored = self.redrives.restore()
        except Exception:  # the runs stay unrestored; every page still serves
            log.exception("console: restoring the redrive runs failed")
            return
        if restored:
            log.info("console: %d redrive run(s) of earlier consoles restored", restored)
        self.runs_restored.set()

    def stop(self) -> None:
        self._stopping.set()
        self.tailer.stop()
        self.sampler.stop()
        self.audit.close()

    # ------------------------------------------------------------------ plumbing

    def render(self, name: str, req: Request, **context: Any) -> str:
        return self.env.get_template(name).render(
            ns=self.ns.name, me=req.principal, csrf=req.csrf, path=req.path, tail_error=self.tailer.error,
            indexed=self.index.count(), **context,
        )

    def route(self, req: Request) -> tuple[HTTPStatus, str, str | None]:
        """(status, body, where to redirect to)."""
        for method, pattern, handler in self.routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                return handler(req, *match.groups())
        if any(p.fullmatch(req.path) for _, p, _ in self.routes):
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed")
        raise HttpError(HTTPStatus.NOT_FOUND, "no such page")

    def _record(self, req: Request, action: str, what: dict[str, Any], result: str) -> None:
        """In the audit log, and in the index at once (the tailer reads it in again: the
        same partition and offset), so the next page shows it."""
        part, off, event = self.audit.record(req.principal.name, action, what, result)
        self.index.add([], audits=[(part, off, event)])

    def _act(self, req: Request, action: str, what: dict[str, Any], do: Callable[[], Any]) -> Any:
        """An operator action, recorded in the audit log with its result either way."""
        try:
            result = do()
        except ReplayBrokerError as exc:
            self._record(req, action, what, f"refused: {exc}")
            raise HttpError(HTTPStatus.CONFLICT, str(exc)) from exc
        self._record(req, action, what, "ok")
        return result

    # ------------------------------------------------------------------ pages

    def overview(self, req: Request) -> tuple[HTTPStatus, str, None]:
        latest = self.sampler.latest()
        worst: list[tuple[int, int]] = []
        per = (latest or {}).get("pending_per_partition") or []
        worst = sorted(((n, p) for p, n in enumerate(per) if isinstance(n, int) and n > 0), reverse=True)[:WORST]
        now = time.time()
        series = self.sampler.series()
        charts = [
            line_chart("completed / s", series["completed"], now),
            line_chart("replayed / s", series["replayed"], now),
            line_chart("dead-lettered / s", series["dlq"], now),
            line_chart("pending", series["pending"], now),
            line_chart("replays backed off / s", series["replays_backed_off"], now),
            line_chart("replays waiting their turn or rate / s", series["replays_waited"], now),
        ]
        counters = (latest or {}).get("counters", {})
        waits = {name: counters.get(name, 0) for name in (*WAITS, "outage_stopped_ms")}
        return HTTPStatus.OK, self.render(
            "overview.html", req, status=latest, worst=worst, charts=charts, waits=waits,
            sample_error=self.sampler.error, samples=len(self.sampler.samples),
        ), None

    def _filter(self, q: dict[str, str]) -> Filter:
        key = q.get("key")
        header_value = q.get("header_value")
        return Filter(
            topic=q.get("topic") or None,
            key=key.encode() if key else None,
            reason_prefix=q.get("reason") or None,
            since_ms=parse_time(q.get("since")),
            until_ms=parse_time(q.get("until")),
            header_name=q.get("header") or None,
            header_value=header_value.encode() if header_value and q.get("header") else None,
        )

    def dead_letters(self, req: Request) -> tuple[HTTPStatus, str, None]:
        f = self._filter(req.query)
        page = self.index.page(f, cursor=req.query.get("cursor"))
        keep = {k: v for k, v in req.query.items() if k != "cursor" and v}
        return HTTPStatus.OK, self.render(
            "dead_letters.html", req, page=page, q=req.query, topics=self.index.topics(),
            next_query=urllib.parse.urlencode({**keep, "cursor": page.next_cursor}) if page.next_cursor else None,
            filter_query=urllib.parse.urlencode(keep),
        ), None

    def dead_letter(self, req: Request, part: str, off: str) -> tuple[HTTPStatus, str, None]:
        row = self.index.get(int(part), int(off))
        if row is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no entry {part}@{off} in {self.ns.dlq}")
        return HTTPStatus.OK, self.render("dead_letter.html", req, row=row), None

    def quarantine(self, req: Request) -> tuple[HTTPStatus, str, None]:
        page = self.index.page(Filter(), kind="quarantine", cursor=req.query.get("cursor"))
        return HTTPStatus.OK, self.render(
            "quarantine.html", req, page=page,
            next_query=urllib.parse.urlencode({"cursor": page.next_cursor}) if page.next_cursor else None,
        ), None

    def trace(self, req: Request) -> tuple[HTTPStatus, str, None]:
        ident_text = (req.query.get("id") or "").strip()
        key = req.query.get("key")
        topic = (req.query.get("topic") or "").strip()
        result = None
        error = None
        candidates: list[Any] = []
        found: dict[str, Any] | None = None
        if ident_text:
            try:
                ident = tracing.parse_id(ident_text)
            except ValueError as exc:
                error = str(exc)
            else:
                try:
                    result = tracing.trace(self.settings, self.ns.name, ident)
                except ReplayBrokerError as exc:
                    error = str(exc)
        elif key:
            candidates = self.index.by_key(key.encode())
            if topic:
                since = parse_time(req.query.get("since")) or int((time.time() - KEY_WINDOW_S) * 1000)
                try:
                    found = tracing.find_key(self.settings, topic, key.encode(), since_ms=since)
                except ReplayBrokerError as exc:
                    error = str(exc)
        marks, spans, height, span = timeline(result) if result else ([], [], 0, None)
        return HTTPStatus.OK, self.render(
            "trace.html", req, result=result, error=error, ident=ident_text, key=key or "", candidates=candidates,
            marks=marks, spans=spans, height=height, span=span, topic=topic, found=found,
            since=req.query.get("since", ""), topics=self.index.topics(), window_h=KEY_WINDOW_S // 3600,
        ), None

    def redrive_page(self, req: Request) -> tuple[HTTPStatus, str, None]:
        start = _start_of(req.query)
        runs, total = self.redrives.page(start, RUNS_PAGE)
        history, next_history = self.index.runs(req.query.get("history"))
        return HTTPStatus.OK, self.render(
            "redrive.html", req, runs=runs, runs_start=start, runs_total=total, runs_page=RUNS_PAGE,
            restored=self.runs_restored.is_set(), history=history, q=req.query, topics=self.index.topics(),
            next_history=urllib.parse.urlencode({"history": next_history}) if next_history else None,
        ), None

    def redrive_plan(self, req: Request) -> tuple[HTTPStatus, str, None]:
        f = self._filter(req.form)
        plan = self.redrives.plan(f, req.principal.name)
        self._record(req, "redrive dry run", {"filter": f.as_json(), "plan": plan.id}, f"ok: {plan.count} selected")
        return HTTPStatus.OK, self.render("plan.html", req, plan=plan, rate=req.form.get("rate", "")), None

    def redrive_confirm(self, req: Request) -> tuple[HTTPStatus, str, str]:
        plan_id, digest = req.form.get("plan", ""), req.form.get("digest", "")
        what: dict[str, Any] = {"plan": plan_id, "rate_per_s": req.form.get("rate") or None}

        def go() -> Any:
            plan = self.redrives.bound_plan(plan_id, digest)
            what.update(filter=plan.filter.as_json(), count=plan.count)
            run = self.redrives.start(plan, parse_rate(req.form.get("rate")), req.principal.name)
            what.update(started(plan, run))  # what a console started again resumes the run from
            return run

        run = self._act(req, "redrive start", what, go)
        return HTTPStatus.SEE_OTHER, "", f"/redrive#run-{run.id}"

    def redrive_cancel(self, req: Request, run_id: str) -> tuple[HTTPStatus, str, str]:
        self._act(req, "redrive cancel", {"run": run_id}, lambda: self.redrives.cancel(run_id))
        return HTTPStatus.SEE_OTHER, "", f"/redrive#run-{run_id}"

    def redrive_resume(self, req: Request, run_id: str) -> tuple[HTTPStatus, str, str]:
        self._act(req, "redrive resume", {"run": run_id},
                  lambda: self.redrives.resume(run_id, req.principal.name))
        return HTTPStatus.SEE_OTHER, "", f"/redrive#run-{run_id}"

    def audit_page(self, req: Request) -> tuple[HTTPStatus, str, None]:
        events, total, cursor = self.index.audit(req.query.get("cursor"))
        return HTTPStatus.OK, self.render(
            "audit.html", req, events=events, total=total,
            next_query=urllib.parse.urlencode({"cursor": cursor}) if cursor else None,
        ), None


def _start_of(query: dict[str, str]) -> int:
    try:
        return max(0, int(query.get("start", "0")))
    except ValueError:
        return 0


def handler_for(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "replaybroker-console"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: HTTPStatus, body: bytes, content_type: str = "text/html; charset=utf-8",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in {**HEADERS, **(extra or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: HTTPStatus, message: str, principal: Principal | None = None) -> None:
            extra = {}
            if status == HTTPStatus.UNAUTHORIZED:
                extra["WWW-Authenticate"] = 'Basic realm="replaybroker console", charset="UTF-8"'
            body = console.env.get_template("error.html").render(
                ns=console.ns.name, status=int(status), phrase=status.phrase, message=message, me=principal, path="",
            )
            self._send(status, body.encode(), extra=extra)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_HEAD(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            if path == "/healthz":
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
                return
            if path.startswith("/static/"):
                name = path.removeprefix("/static/")
                if name not in STATIC:
                    self._error(HTTPStatus.NOT_FOUND, "no such file")
                    return
                self._send(HTTPStatus.OK, (HERE / "static" / name).read_bytes(), STATIC[name],
                           {"Cache-Control": "max-age=300"})
                return
            if console.auth.open and not loopback_host(self.headers.get("Host", "")):
                self._error(HTTPStatus.FORBIDDEN, "without tokens the console answers only to a loopback host name")
                return
            principal = console.auth.authenticate(self.headers.get("Authorization"))
            if principal is None:
                self._error(HTTPStatus.UNAUTHORIZED, "log in: user = your role (viewer or operator), password = its token")
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            form: dict[str, str] = {}
            try:
                if method == "POST":
                    form = self._form()
                    if not principal.can_operate:
                        raise HttpError(HTTPStatus.FORBIDDEN, "this needs the operator role")
                    if not same_origin(headers, self.headers.get("Host", "")):
                        raise HttpError(HTTPStatus.FORBIDDEN, "a change must come from a page of this console (Origin)")
                    if not console.auth.csrf_ok(principal, form.get("csrf")):
                        raise HttpError(HTTPStatus.FORBIDDEN, "the form's CSRF token is missing or wrong: reload the page")
                query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=False))
                req = Request(method, path, query, form, principal, console.auth.csrf_token(principal), headers)
                status, body, location = console.route(req)
            except HttpError as exc:
                self._error(exc.status, str(exc), principal)
                return
            except ConfigurationError as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc), principal)
                return
            except ReplayBrokerError as exc:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), principal)
                return
            except Exception:  # a page that fails answers 500 and is logged; the console keeps serving
                log.exception("console: %s %s failed", method, path)
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "this page failed; the console's log says why", principal)
                return
            if location is not None:
                self.send_response(status)
                for name, value in HEADERS.items():
                    self.send_header(name, value)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send(status, body.encode())

        def _form(self) -> dict[str, str]:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                raise HttpError(HTTPStatus.BAD_REQUEST, "a form needs its Content-Length")
            if length > MAX_BODY:
                raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "form too large")
            ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            raw = self.rfile.read(length) if length else b""
            if ctype != "application/x-www-form-urlencoded":
                raise HttpError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "forms only (application/x-www-form-urlencoded)")
            return dict(urllib.parse.parse_qsl(raw.decode("utf-8", "replace")))

    return Handler


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser drops its idle keep-alive connections: nothing to report.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Server:
    """The console on ``bind:port`` (port 0: a free one, see ``port``)."""

    def __init__(self, console: Console, bind: str = "127.0.0.1", port: int = 8080) -> None:
        check_bind(bind, console.auth)
        self.console = console
        self.httpd = _HTTPServer((bind, port), handler_for(console))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.console.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="console-http", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self.console.start()
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.console.stop()


def build(settings: KafkaSettings, namespace: str, auth: Authenticator, *, index_path: str | Path,
          bind: str = "127.0.0.1", port: int = 8080, sample_every_s: float = 10.0) -> Server:
    return Server(Console(settings, namespace, auth, Index(index_path), sample_every_s=sample_every_s), bind, port)
