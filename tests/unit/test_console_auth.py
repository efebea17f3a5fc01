"""The console's roles, tokens and CSRF tokens (broker.console.auth), pure."""

from __future__ import annotations

import base64

import pytest

from broker.console.auth import (
    Authenticator,
    Role,
    check_bind,
    load_tokens,
    loopback_host,
    parse_tokens,
    same_origin,
)
from broker.errors import ConfigurationError

VIEWER, OPERATOR = "v" * 20, "o" * 20


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(parse_tokens(f"viewer={VIEWER},operator={OPERATOR}"))


def test_tokens_parse_from_commas_or_lines_with_comments() -> None:
    assert parse_tokens(f"viewer={VIEWER}\n# a comment\noperator={OPERATOR}  # ops\n") == {
        VIEWER: Role.VIEWER, OPERATOR: Role.OPERATOR}
    assert load_tokens(None, {"REPLAYBROKER_CONSOLE_TOKENS": f"viewer={VIEWER}"}) == {VIEWER: Role.VIEWER}
    assert load_tokens(None, {}) == {}


@pytest.mark.parametrize("text", ["admin=" + "x" * 20, "viewer", "viewer=short", f"viewer={VIEWER},operator={VIEWER}"])
def test_bad_tokens_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_tokens(text)


@pytest.mark.parametrize(
    ("header", "role"),
    [
        (f"Bearer {VIEWER}", Role.VIEWER),
        (f"Bearer {OPERATOR}", Role.OPERATOR),
        (basic("viewer", VIEWER), Role.VIEWER),
        (basic("operator", OPERATOR), Role.OPERATOR),
        (basic("Operator", OPERATOR), Role.OPERATOR),
        (basic("operator", VIEWER), None),  # a viewer's token does not make an operator
        (basic("viewer", OPERATOR), None),
        (basic("viewer", "nope"), None),
        ("Bearer wrong-token-xxxxxxxxx", None),
        ("Basic !!!", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
        ("", None),
        (None, None),
    ],
)
def test_requests_authenticate_by_bearer_or_basic(auth: Authenticator, header: str | None, role: Role | None) -> None:
    principal = auth.authenticate(header)
    assert (principal.role if principal else None) == role


def test_the_principal_names_the_role_and_not_the_token(auth: Authenticator) -> None:
    principal = auth.authenticate(f"Bearer {OPERATOR}")
    assert principal is not None and principal.can_operate
    assert principal.name.startswith("operator:") and OPERATOR not in principal.name
    viewer = auth.authenticate(f"Bearer {VIEWER}")
    assert viewer is not None and not viewer.can_operate


def test_csrf_token_is_bound_to_the_credentials_and_the_process(auth: Authenticator) -> None:
    op = auth.authenticate(f"Bearer {OPERATOR}")
    viewer = auth.authenticate(f"Bearer {VIEWER}")
    assert op is not None and viewer is not None
    token = auth.csrf_token(op)
    assert auth.csrf_ok(op, token)
    changed = token[:-1] + ("1" if token.endswith("0") else "0")  # the secret is random: so is the last digit
    assert not auth.csrf_ok(op, None) and not auth.csrf_ok(op, "") and not auth.csrf_ok(op, changed)
    assert not auth.csrf_ok(op, auth.csrf_token(viewer))
    other = Authenticator(auth.tokens)  # another process: another secret
    assert not other.csrf_ok(op, token)


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({"origin": "http://127.0.0.1:8080"}, True),
        ({"origin": "http://127.0.0.1:8080/"}, True),
        ({"origin": "http://evil.example"}, False),
        ({"origin": "http://127.0.0.1:8081"}, False),
        ({"origin": "null"}, False),
        ({"sec-fetch-site": "same-origin"}, True),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"origin": "http://evil.example", "sec-fetch-site": "same-origin"}, False),
        ({}, False),
    ],
)
def test_same_origin(headers: dict[str, str], ok: bool) -> None:
    assert same_origin(headers, "127.0.0.1:8080") is ok


def test_without_tokens_only_loopback(auth: Authenticator) -> None:
    open_auth = Authenticator({})
    assert open_auth.authenticate(None) is not None
    check_bind("127.0.0.1", open_auth)
    check_bind("::1", open_auth)
    for bind in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ConfigurationError, match="loopback only"):
            check_bind(bind, open_auth)
    check_bind("0.0.0.0", auth)


@pytest.mark.parametrize(
    ("host", "ok"),
    [("127.0.0.1:8080", True), ("localhost:8080", True), ("localhost", True), ("[::1]:8080", True),
     ("127.0.0.2", True), ("evil.example:8080", False), ("127.0.0.1.evil.example", False), ("", False),
     ("[::ffff:1.2.3.4]:80", False)],
)
def test_loopback_host_names(host: str, ok: bool) -> None:
    """Without tokens, what a rebound name (DNS rebinding) sends as Host is refused."""
    assert loopback_host(host) is ok
