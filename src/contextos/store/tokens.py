"""API tokens as the store keeps them: who each acts for, and a hash of its secret.

The same statements on SQLite and PostgreSQL, run through the queue's backend hooks (a store
class takes `SqlTokens` beside its queue). The secret itself is never stored: issuing and
checking tokens is `contextos.policy.tokens`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from contextos.errors import ConfigError
from contextos.store.base import conforms
from contextos.store.statements import Start, all_rows, changed_rows, first_row

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiToken:
    """An API token's record: the principal it authenticates as (never its secret)."""

    token_id: str
    """Public part of the token, shown in listings and used to revoke it."""
    tenant: str
    """The tenant it acts in: it sees nothing of any other."""
    user: str
    """The user id it acts as."""
    roles: tuple[str, ...] = ()
    """Approver roles it may use (within the roles the policy gives the user in its tenant)."""
    scopes: tuple[str, ...] = ()
    """Scopes the runs it starts may be delegated."""
    label: str = ""
    """What it is for, as its issuer wrote."""
    created_at: datetime
    """When it was issued."""
    revoked_at: datetime | None = None
    """When it was revoked; a revoked token authenticates nothing."""


@runtime_checkable
class TokenStore(Protocol):
    """Where API tokens are kept (both SQL stores)."""

    async def add_token(self, token: ApiToken, secret_hash: str) -> None:
        """Keep a new token (its id is random: a taken one fails as the database says)."""

    async def token(self, token_id: str) -> tuple[ApiToken, str] | None:
        """A token and its secret's hash, or None."""

    async def list_tokens(self, *, tenant: str | None = None) -> list[ApiToken]:
        """Tokens (revoked ones too), oldest first; only one tenant's when named."""

    async def revoke_token(self, token_id: str, *, at: datetime) -> bool:
        """Mark a token revoked; False when there is no such token or it was revoked before."""


def tokens_of(store: object) -> TokenStore:
    """The store's tokens; ConfigError for a store that keeps none."""
    if conforms(store, TokenStore):
        return cast(TokenStore, store)
    raise ConfigError(
        f"{type(store).__name__} keeps no API tokens; use a SQLite or PostgreSQL store"
    )


_COLUMNS = "token_id, tenant, user_id, roles, scopes, label, created_at, revoked_at, secret_hash"
_ADD = (
    f"INSERT INTO api_tokens ({_COLUMNS}) VALUES (:token_id, :tenant, :user_id, :roles, "
    ":scopes, :label, :created_at, NULL, :secret_hash)"
)
_ONE = f"SELECT {_COLUMNS} FROM api_tokens WHERE token_id = :token_id"
_ALL = f"SELECT {_COLUMNS} FROM api_tokens ORDER BY created_at, token_id"
_OF_TENANT = (
    f"SELECT {_COLUMNS} FROM api_tokens WHERE tenant = :tenant ORDER BY created_at, token_id"
)
_REVOKE = "UPDATE api_tokens SET revoked_at = :at WHERE token_id = :token_id AND revoked_at IS NULL"


class SqlTokens:
    """TokenStore operations on the queue's backend hooks (`_execute`, `_stored`, `_instant`)."""

    if TYPE_CHECKING:  # supplied by the backend's queue class beside this one

        async def _execute(self, start: Start[T], *, atomic: bool = False) -> T: ...

        def _stored(self, at: datetime | None) -> Any: ...

        def _instant(self, value: Any) -> datetime: ...

    async def add_token(self, token: ApiToken, secret_hash: str) -> None:
        params = {
            "token_id": token.token_id,
            "tenant": token.tenant,
            "user_id": token.user,
            "roles": json.dumps(list(token.roles)),
            "scopes": json.dumps(list(token.scopes)),
            "label": token.label,
            "created_at": self._stored(token.created_at),
            "secret_hash": secret_hash,
        }
        await self._execute(lambda: changed_rows(_ADD, params))

    async def token(self, token_id: str) -> tuple[ApiToken, str] | None:
        row = await self._execute(lambda: first_row(_ONE, {"token_id": token_id}))
        return None if row is None else (self._token(row), str(row[8]))

    async def list_tokens(self, *, tenant: str | None = None) -> list[ApiToken]:
        if tenant is None:
            rows = await self._execute(lambda: all_rows(_ALL, {}))
        else:
            rows = await self._execute(lambda: all_rows(_OF_TENANT, {"tenant": tenant}))
        return [self._token(row) for row in rows]

    async def revoke_token(self, token_id: str, *, at: datetime) -> bool:
        params = {"token_id": token_id, "at": self._stored(at)}
        return bool(await self._execute(lambda: changed_rows(_REVOKE, params)))

    def _token(self, row: Sequence[Any]) -> ApiToken:
        return ApiToken(
            token_id=str(row[0]),
            tenant=str(row[1]),
            user=str(row[2]),
            roles=tuple(json.loads(row[3])),
            scopes=tuple(json.loads(row[4])),
            label=str(row[5]),
            created_at=self._instant(row[6]),
            revoked_at=None if row[7] is None else self._instant(row[7]),
        )


__all__ = ["ApiToken", "SqlTokens", "TokenStore", "tokens_of"]
