"""Who may read what from the read API and the dashboard: API tokens, each with the accounts it may read.

LEDGER_API_TOKENS names a tokens file (TOML, or JSON when the name ends in .json). Per token, a name, the
SHA-256 of the token (hex; the file never holds a token itself, so reading it grants nothing), the account
patterns it may read (shell-style globs, as in the clients' policies) and whether it may see the views that
span the whole ledger (``system``):

    [tokens.dashboard]
    sha256 = "5e88...d1"           # `ledger api-token NAME` makes a token and prints its entry
    accounts = ["*"]
    system = true                  # /metrics, /events, /api/*, /transactions, /commands, /transfers, /drift

    [tokens.wallet-42]
    sha256 = "9f86...08"
    accounts = ["user:42:*"]

A request presents its token as ``Authorization: Bearer <token>``, as a ``token`` query parameter, or in
the ``ledger_token`` cookie, which opening the dashboard as ``/?token=<token>`` sets (a browser's
EventSource cannot send headers; same-site, HTTP only). A missing or unknown token is answered 401
(``missing_token``, ``unknown_token``), an account outside the token's grant or a system view without the
grant 403 (``not_permitted``), as JSON errors like every other. The dashboard page, its static files,
/healthz and the OpenAPI docs hold no ledger data and stay open. Without LEDGER_API_TOKENS the API runs open
(development), and says so at start. docs/security.md ("Read API access") has why.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qs, unquote

from streams.config import ConfigError

log = logging.getLogger("ledger.api.access")

ENV_TOKENS = "LEDGER_API_TOKENS"
COOKIE = "ledger_token"
# Paths that hold no ledger data: the dashboard's page and assets, liveness, the API's own description.
PUBLIC = ("/", "/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
PUBLIC_PREFIXES = ("/static/",)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Grant:
    name: str
    accounts: tuple[str, ...]
    system: bool = False

    def may_read(self, account_id: str) -> bool:
        return any(fnmatchcase(account_id, pattern) for pattern in self.accounts)


@dataclass(frozen=True, slots=True)
class Denial:
    status: int
    code: str
    message: str


def judge(grant: Grant | None, presented: bool, path: str) -> Denial | None:
    """Whether a request for path may be answered: None, or why not. grant: the presented token's, None
    when no token was presented (presented=False) or an unknown one was."""
    if path in PUBLIC or path.startswith(PUBLIC_PREFIXES):
        return None
    if grant is None:
        if not presented:
            return Denial(401, "missing_token", "this API needs a token: Authorization: Bearer <token>, or "
                                                "?token=<token> (docs/security.md)")
        return Denial(401, "unknown_token", "the token presented is not one of this API's tokens")
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "accounts" and parts[2]:
        account_id = unquote(parts[2])
        if grant.may_read(account_id):
            return None
        return Denial(403, "not_permitted", f"token {grant.name!r} may read {', '.join(grant.accounts) or 'no accounts'}, "
                                            f"not {account_id[:200]}")
    if grant.system:
        return None
    return Denial(403, "not_permitted", f"token {grant.name!r} may read accounts only; {path[:200]} is a "
                                        f"ledger-wide view (a token with system = true may read it)")


class ApiTokens:
    def __init__(self, grants: Mapping[str, Grant], source: str = "tokens"):
        self._by_hash = dict(grants)  # sha256 hex -> grant
        self.source = source

    def __len__(self) -> int:
        return len(self._by_hash)

    def grant(self, token: str) -> Grant | None:
        return self._by_hash.get(token_hash(token))

    @classmethod
    def from_mapping(cls, data: Mapping, source: str = "tokens") -> "ApiTokens":
        table = data.get("tokens") if isinstance(data, Mapping) else None
        if not isinstance(table, Mapping) or not table:
            raise ConfigError(f"{source}: needs a [tokens.<name>] table per token")
        grants = {}
        for name, entry in table.items():
            where = f"{source}: token {name!r}"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where} must be a table")
            unknown = set(entry) - {"sha256", "accounts", "system"}
            if unknown:
                raise ConfigError(f"{where} has unknown fields {sorted(unknown)} (known: sha256, accounts, system)")
            digest = entry.get("sha256")
            if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(f"{where}: sha256 must be the 64 lowercase hex digits of the token's SHA-256")
            accounts = entry.get("accounts", [])
            if not isinstance(accounts, list) or not all(isinstance(p, str) and p for p in accounts):
                raise ConfigError(f"{where}: accounts must be a list of account patterns")
            system = entry.get("system", False)
            if not isinstance(system, bool):
                raise ConfigError(f"{where}: system must be true or false")
            grants[digest] = Grant(name, tuple(accounts), system)
        return cls(grants, source)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ApiTokens | None":
        env = os.environ if env is None else env
        path = env.get(ENV_TOKENS)
        if not path:
            log.warning("%s is not set: the read API and dashboard answer anyone who can reach them "
                        "(development mode); set it to a tokens file (docs/security.md)", ENV_TOKENS)
            return None
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{ENV_TOKENS}={path}: {exc}") from None
        return cls.from_mapping(data, path)


def _presented(scope) -> tuple[str | None, bool]:
    """The request's token and whether it came as a query parameter (the dashboard's login link)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip(), False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][0], True
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            cookie = SimpleCookie()
            try:
                cookie.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed cookie header is no token
                continue
            if COOKIE in cookie:
                return cookie[COOKIE].value, False
    return None, False


def _cookie_safe(token: str) -> bool:
    return token.isascii() and all(c.isalnum() or c in "-_." for c in token)


class TokenGate:
    """ASGI middleware in front of the whole API: judge() decides, before any route runs."""

    def __init__(self, app, tokens: ApiTokens):
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token, from_query = _presented(scope)
        grant = None if token is None else self.tokens.grant(token)
        denial = judge(grant, token is not None, scope["path"])
        if denial is not None:
            body = json.dumps({"error": {"code": denial.code, "message": denial.message}}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            if denial.status == 401:
                headers.append((b"www-authenticate", b'Bearer realm="ledger"'))
            await send({"type": "http.response.start", "status": denial.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if not (from_query and grant is not None and scope["path"] == "/" and _cookie_safe(token)):
            return await self.app(scope, receive, send)

        async def with_cookie(message):  # the dashboard's login link: its page's later requests carry the token
            if message["type"] == "http.response.start":
                cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict".encode("latin-1")
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
            await send(message)

        return await self.app(scope, receive, with_cookie)
