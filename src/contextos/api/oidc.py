"""Single sign-on: bearer tokens an OpenID Connect provider signed act as the user they name.

A token is a JWT verified against the provider's published keys (its JWKS, found through
`{issuer}/.well-known/openid-configuration` unless given): signature, issuer, audience and
lifetime, with an asymmetric algorithm only (a token signed with `none` or an HMAC cannot
pass, so a public key can never be used as a shared secret). The user, the tenant and the
roles come from the token's claims; scopes from its `scope` (or `scp`) claim. Keys are fetched
once and again when a token names a key not yet seen (the provider rotated its keys), at most
once per `refresh_s`, so tokens with made-up key ids cannot make the server hammer the
provider.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from contextos import ConfigError, Principal, PrincipalKind
from contextos.api.errors import ApiError

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
"""The signature algorithms accepted by default: asymmetric ones only."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OidcConfig:
    """Which provider's tokens a server accepts, and how their claims name a principal."""

    issuer: str
    """The provider's issuer URL, exactly as its tokens' `iss` claim says it."""
    audience: str
    """What the tokens' `aud` claim must contain: this API's client id at the provider."""
    jwks_url: str | None = None
    """Where the provider publishes its keys (None: from its discovery document)."""
    tenant_claim: str = "tenant"
    """The claim naming the user's tenant (a token without it is refused)."""
    user_claim: str = "sub"
    """The claim naming the user."""
    roles_claim: str = "roles"
    """The claim listing the user's roles (a list, or names separated by spaces)."""
    algorithms: tuple[str, ...] = ALGORITHMS
    leeway_s: float = 30.0
    """Clock skew tolerated on `exp`, `nbf` and `iat`."""
    refresh_s: float = 60.0
    """The shortest time between two fetches of the keys for unknown key ids."""

    def __post_init__(self) -> None:
        if not self.issuer.startswith(("https://", "http://")):
            raise ConfigError(f"the OIDC issuer must be a URL, not {self.issuer!r}")
        if not self.audience:
            raise ConfigError("an OIDC issuer needs an audience: pass --oidc-audience CLIENT_ID")
        weak = [a for a in self.algorithms if a == "none" or a.startswith("HS")]
        if weak:
            raise ConfigError(
                f"OIDC tokens must be signed with a public-key algorithm, not {', '.join(weak)}"
            )


class OidcVerifier:
    """Verifies the provider's tokens and names the principal each one acts as."""

    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def principal(self, token: str) -> Principal:
        """The principal `token` acts as; a 401 with the reason when it acts as none."""
        cfg = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise self._refused(f"the bearer token is not a JWT ({exc})") from None
        alg = header.get("alg")
        if alg not in cfg.algorithms:
            raise self._refused(f"the token is signed with {alg!r}, which this server refuses")
        key = await self._key(str(header.get("kid", "")))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[str(alg)],
                audience=cfg.audience,
                issuer=cfg.issuer,
                leeway=cfg.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise self._refused(f"the token was refused: {exc}") from None
        tenant = claims.get(cfg.tenant_claim)
        user = claims.get(cfg.user_claim)
        if not isinstance(tenant, str) or not tenant:
            raise self._refused(f"the token names no tenant (claim {cfg.tenant_claim!r})")
        if not isinstance(user, str) or not user:
            raise self._refused(f"the token names no user (claim {cfg.user_claim!r})")
        return Principal(
            kind=PrincipalKind.USER,
            id=user,
            tenant=tenant,
            scopes=_names(claims.get("scope", claims.get("scp"))),
            roles=_names(claims.get(cfg.roles_claim)),
        )

    def _refused(self, message: str) -> ApiError:
        cfg = self.config
        return ApiError(
            401,
            "unauthenticated",
            message,
            hint=f"Sign in at {cfg.issuer} again for a token whose audience is {cfg.audience!r}.",
        )

    async def _key(self, kid: str) -> jwt.PyJWK:
        async with self._lock:
            known = self._keys.get(kid)
            if known is not None:
                return known
            due = self._fetched_at is None or (
                time.monotonic() - self._fetched_at >= self.config.refresh_s
            )
            if due:
                self._keys = await self._fetch()
                self._fetched_at = time.monotonic()
        found = self._keys.get(kid)
        if found is None:
            raise self._refused(f"the token's key {kid!r} is not one the issuer publishes")
        return found

    async def _fetch(self) -> dict[str, jwt.PyJWK]:
        cfg = self.config
        try:
            async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as http:
                url = cfg.jwks_url or await _jwks_url(http, cfg.issuer)
                response = await http.get(url)
                response.raise_for_status()
                keys = jwt.PyJWKSet.from_dict(response.json()).keys
        except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
            raise ApiError(
                503,
                "issuer_unreachable",
                f"the keys of the OIDC issuer {cfg.issuer} could not be read ({exc})",
                hint="Check that the issuer (or --oidc-jwks) is reachable from the server.",
            ) from None
        return {str(k.key_id or ""): k for k in keys}


async def _jwks_url(http: httpx.AsyncClient, issuer: str) -> str:
    """The provider's key URL, from its discovery document (which must name the same issuer)."""
    response = await http.get(issuer.rstrip("/") + "/.well-known/openid-configuration")
    response.raise_for_status()
    document = response.json()
    if document.get("issuer") != issuer or not isinstance(document.get("jwks_uri"), str):
        raise ValueError(f"its discovery document names issuer {document.get('issuer')!r}")
    return str(document["jwks_uri"])


def _names(value: object) -> tuple[str, ...]:
    """A claim's names: a list of strings, or one string of names separated by spaces."""
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list):
        return tuple(str(v) for v in value if isinstance(v, str) and v)
    return ()


__all__ = ["ALGORITHMS", "OidcConfig", "OidcVerifier"]
