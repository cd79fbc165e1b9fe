"""API tokens on both stores: only a hash is kept, every check reads the store (a revocation
holds from the next request on), and each token is one user of one tenant."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos import (
    ConfigError,
    Runtime,
    Unauthenticated,
    authenticate,
    issue_token,
    list_tokens,
    revoke_token,
)
from contextos.policy import PrincipalKind
from contextos.store.tokens import tokens_of


async def test_issue_authenticate_list_and_revoke(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        record, secret = await issue_token(
            rt.store, tenant="acme", user="alice", roles=("finance",), scopes=("payments:*",)
        )
        await issue_token(rt.store, tenant="globex", user="carol")
        principal = await authenticate(rt.store, secret)
        assert (principal.kind, principal.id, principal.tenant) == (
            PrincipalKind.USER,
            "alice",
            "acme",
        )
        assert (principal.roles, principal.scopes) == (("finance",), ("payments:*",))

        stored = await tokens_of(rt.store).token(record.token_id)
        assert stored is not None and stored[0] == record
        assert secret not in stored[1] and record.token_id in secret  # a hash, not the secret

        assert [t.user for t in await list_tokens(rt.store)] == ["alice", "carol"]
        assert [t.user for t in await list_tokens(rt.store, tenant="acme")] == ["alice"]

        with pytest.raises(Unauthenticated):
            await authenticate(rt.store, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
        with pytest.raises(Unauthenticated):
            await authenticate(rt.store, "not a token")

        assert await revoke_token(rt.store, record.token_id)
        assert not await revoke_token(rt.store, record.token_id)
        assert not await revoke_token(rt.store, "0" * 16)
    async with Runtime(backend_url) as fresh:  # another process sees the revocation too
        with pytest.raises(Unauthenticated, match="revoked"):
            await authenticate(fresh.store, secret)
        (revoked, _) = [t for t in await list_tokens(fresh.store)]
        assert revoked.revoked_at is not None


async def test_names_a_token_cannot_carry(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/t.db") as rt:
        for bad in ({"tenant": "a b", "user": "x"}, {"tenant": "t", "user": "bob@acme"}):
            with pytest.raises(ConfigError, match="without spaces or '@'"):
                await issue_token(rt.store, **bad)
        assert await list_tokens(rt.store) == []
