"""API tokens: issued for one user of one tenant, checked on every request, revoked at once.

A token reads `ctx_<id>_<secret>`. The store keeps the id and a SHA-256 of the whole token
(the secret is 256 random bits, so a fast hash is enough: nothing to guess from it); the token
itself is shown once, when it is issued. Every check reads the store, so a revoked token is
refused from the next request on.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from contextos.errors import ConfigError, Unauthenticated
from contextos.events import utcnow
from contextos.policy.identity import Principal, PrincipalKind
from contextos.store.tokens import ApiToken, tokens_of

_SHAPE = re.compile(r"ctx_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")
_NAME = re.compile(r"[^\s@]{1,200}")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _name(what: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} must be 1 to 200 characters without spaces or '@'",
            **{what: value},
        )
    return value


async def issue_token(
    store: object,
    *,
    tenant: str,
    user: str,
    roles: tuple[str, ...] = (),
    scopes: tuple[str, ...] = (),
    label: str = "",
) -> tuple[ApiToken, str]:
    """A new token acting as `user` of `tenant`, and its secret (shown once, never stored)."""
    for role in roles:
        _name("role", role)
    record = ApiToken(
        token_id=secrets.token_hex(8),
        tenant=_name("tenant", tenant),
        user=_name("user", user),
        roles=tuple(dict.fromkeys(roles)),
        scopes=tuple(dict.fromkeys(scopes)),
        label=label,
        created_at=utcnow(),
    )
    secret = f"ctx_{record.token_id}_{secrets.token_urlsafe(32)}"
    await tokens_of(store).add_token(record, _hash(secret))
    return record, secret


async def authenticate(store: object, token: str) -> Principal:
    """The principal a bearer token acts as; Unauthenticated when it is unknown or revoked."""
    shape = _SHAPE.fullmatch(token.strip())
    found = await tokens_of(store).token(shape.group(1)) if shape else None
    if found is None or not hmac.compare_digest(found[1], _hash(token.strip())):
        raise Unauthenticated("the bearer token is not one this server issued")
    record = found[0]
    if record.revoked_at is not None:
        raise Unauthenticated(
            f"token {record.token_id} was revoked at {record.revoked_at:%Y-%m-%d %H:%M} UTC",
            token_id=record.token_id,
        )
    return Principal(
        kind=PrincipalKind.USER,
        id=record.user,
        tenant=record.tenant,
        scopes=record.scopes,
        roles=record.roles,
    )


async def list_tokens(store: object, *, tenant: str | None = None) -> list[ApiToken]:
    """Issued tokens, revoked ones too, oldest first (never their secrets)."""
    return await tokens_of(store).list_tokens(tenant=tenant)


async def revoke_token(store: object, token_id: str) -> bool:
    """Revoke a token from the next request on; False when it is unknown or already revoked."""
    return await tokens_of(store).revoke_token(token_id, at=utcnow())


__all__ = ["ApiToken", "authenticate", "issue_token", "list_tokens", "revoke_token"]
