"""Who may see and do what: roles, tokens, CSRF - pure, no I/O.

Two roles: ``viewer`` sees every page, ``operator`` also redrives and cancels. A request
authenticates with ``Authorization: Bearer TOKEN`` or HTTP Basic (user: the role, password:
its token), so a browser's own login dialog works. A browser resends Basic credentials by
itself, so a state-changing request must also carry the CSRF token of its credentials (an
HMAC under a secret of the process: a page of another origin cannot read it) and come from
the console's own origin (``Origin``, else ``Sec-Fetch-Site: same-origin``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from broker.errors import ConfigurationError

ENV = "REPLAYBROKER_CONSOLE_TOKENS"


class Role(IntEnum):
    """Ordered: a higher role may do what a lower one may."""

    VIEWER = 1
    OPERATOR = 2

    @property
    def label(self) -> str:
        return self.name.lower()


def parse_tokens(text: str) -> dict[str, Role]:
    """``viewer=TOKEN,operator=TOKEN`` (commas or new lines; ``#`` starts a comment) ->
    token -> role. A role may have several tokens; a token names one role."""
    tokens: dict[str, Role] = {}
    for raw in text.replace(",", "\n").splitlines():
        item = raw.split("#", 1)[0].strip()
        if not item:
            continue
        name, sep, token = item.partition("=")
        name, token = name.strip().lower(), token.strip()
        if not sep or name not in ("viewer", "operator"):
            raise ConfigurationError(f"console tokens: expected viewer=TOKEN or operator=TOKEN, not {name!r}")
        if len(token) < 16:
            raise ConfigurationError(f"console tokens: the {name} token is shorter than 16 characters")
        if token in tokens and tokens[token] != Role[name.upper()]:
            raise ConfigurationError("console tokens: one token is given to two roles")
        tokens[token] = Role[name.upper()]
    return tokens


def load_tokens(path: str | Path | None, environ: Mapping[str, str] = os.environ) -> dict[str, Role]:
    """From ``path`` when given, else ``$REPLAYBROKER_CONSOLE_TOKENS``; empty: no tokens."""
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigurationError(f"console tokens: cannot read {path}: {exc.strerror}") from exc
        return parse_tokens(text)
    return parse_tokens(environ.get(ENV, ""))


@dataclass(frozen=True)
class Principal:
    role: Role
    name: str  # who, as the audit records it: the role and a short fingerprint of its token

    @property
    def can_operate(self) -> bool:
        return self.role >= Role.OPERATOR


def _credentials(header: str) -> tuple[str, str | None] | None:
    """(token, the Basic user or None for Bearer) of an Authorization header."""
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value, None
    if scheme.lower() == "basic" and value:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return (password, user) if sep and password else None
    return None


def _fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:8]


class Authenticator:
    """Tokens -> principals. With no tokens at all every request is an operator: the console
    then serves loopback only (``check_bind``)."""

    def __init__(self, tokens: Mapping[str, Role], secret: bytes | None = None) -> None:
        self.tokens = dict(tokens)
        self.secret = secret or os.urandom(32)

    @property
    def open(self) -> bool:
        return not self.tokens

    def authenticate(self, authorization: str | None) -> Principal | None:
        if self.open:
            return Principal(Role.OPERATOR, "local")
        given = _credentials(authorization or "")
        if given is None:
            return None
        token, user = given
        for known, role in self.tokens.items():
            # compared in constant time, and each known token in turn: no early exit by value
            if hmac.compare_digest(known.encode(), token.encode()):
                # Basic names the role, so a viewer's token typed as "operator" is refused
                if user is not None and user.strip().lower() != role.label:
                    return None
                return Principal(role, f"{role.label}:{_fingerprint(known)}")
        return None

    def csrf_token(self, principal: Principal) -> str:
        return hmac.new(self.secret, f"csrf:{principal.name}".encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, principal: Principal, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(self.csrf_token(principal), token)


def same_origin(headers: Mapping[str, str], host: str) -> bool:
    """A state-changing request comes from a page of the console: its ``Origin`` is the
    console's own (scheme-less compare of host:port), else the browser says
    ``Sec-Fetch-Site: same-origin``. Neither header: refused (every browser sends one on a
    POST)."""
    origin = headers.get("origin")
    if origin:
        _, _, rest = origin.partition("://")
        return bool(host) and rest.rstrip("/").lower() == host.lower()
    return headers.get("sec-fetch-site", "").lower() == "same-origin"


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def loopback_host(host: str) -> bool:
    """A ``Host`` header naming this machine. Without tokens every request must: a page of
    another site whose name was made to point at 127.0.0.1 (DNS rebinding) is same-origin to
    itself and could read the pages and their CSRF token, but it sends its own name."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    return name in LOOPBACK or (name.startswith("127.") and name.replace(".", "").isdigit())


def check_bind(bind: str, auth: Authenticator) -> None:
    """Without tokens anyone who reaches the port is an operator: loopback only."""
    if auth.open and bind not in LOOPBACK and not bind.startswith("127."):
        raise ConfigurationError(
            f"the console has no tokens (--tokens FILE or ${ENV}): it serves loopback only, not --bind {bind}"
        )
