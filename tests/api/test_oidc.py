"""Single sign-on over real HTTP: an OpenID Connect provider on loopback (discovery document
and keys, served by a real HTTP server; tokens signed with its RSA keys) and the API server
accepting its tokens as the users they name, refusing every token it must not trust."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import GREETER, PAYER, error_of, serving
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from contextos import ConfigError
from contextos.api import ApiConfig, OidcConfig

AUDIENCE = "contextos-api"


class Provider:
    """An identity provider: its discovery document, its published keys, tokens it signs."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {"k1": _rsa()}
        self.key_requests = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": provider.issuer, "jwks_uri": provider.issuer + "/jwks"}
                elif self.path == "/jwks":
                    provider.key_requests += 1
                    body = provider.jwks()
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"

    def jwks(self) -> dict[str, Any]:
        published = []
        for kid, key in self.keys.items():
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            published.append(jwk | {"kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": published}

    def sign(self, claims: dict[str, Any], *, kid: str = "k1", key: Any = None) -> str:
        """A token with `claims` over sensible defaults, signed RS256 by key `kid`."""
        now = int(time.time())
        body = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": "bob",
            "tenant": "acme",
            "iat": now,
            "exp": now + 300,
        } | claims
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.keys[kid], algorithm="RS256", headers={"kid": kid})


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def provider() -> Iterator[Provider]:
    idp = Provider()
    thread = threading.Thread(target=idp.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield idp
    finally:
        idp.server.shutdown()
        idp.server.server_close()


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: Provider) -> ApiConfig:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    return ApiConfig(
        store=f"sqlite:///{tmp_path}/runs.db",
        agents=(PAYER, GREETER),
        worker=True,
        policy=str(tmp_path / "policy.toml"),
        oidc=OidcConfig(issuer=provider.issuer, audience=AUDIENCE, refresh_s=3600),
    )


async def test_a_providers_token_acts_as_the_user_and_tenant_it_names(
    provider: Provider, config: ApiConfig
) -> None:
    bob = bearer(provider.sign({"roles": ["support"], "scope": "runs:start runs:read"}))
    carol = bearer(provider.sign({"sub": "carol", "tenant": "globex"}))
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            started = await http.post(
                "/v1/runs",
                params={"wait": "true", "timeout": "60"},
                json={"agent": "greeter", "input": "hi"},
                headers=bob,
            )
            assert started.status_code == 201, started.text
            run_id = started.json()["run_id"]
            events = (await http.get(f"/v1/runs/{run_id}/events", headers=bob)).json()
            (bound,) = [e for e in events["events"] if e["type"] == "context_bound"]
            principal = bound["context"]["principal"]
            assert (principal["id"], principal["tenant"]) == ("bob", "acme")
            assert principal["roles"] == ["support"]
            assert principal["scopes"] == ["runs:start", "runs:read"]
            # another tenant's user, signed by the same provider, does not see it
            error_of(await http.get(f"/v1/runs/{run_id}", headers=carol), 404, "run_not_found")
    assert provider.key_requests == 1  # the keys were fetched once, not per request


async def test_tokens_it_must_not_trust_are_refused_with_the_reason(
    provider: Provider, config: ApiConfig
) -> None:
    public_pem = (
        provider.keys["k1"]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    now = int(time.time())
    refused = {
        "expired": (provider.sign({"iat": now - 900, "exp": now - 600}), "expired"),
        "another audience": (provider.sign({"aud": "someone-else"}), "audience"),
        "another issuer": (provider.sign({"iss": "https://evil.example"}), "issuer"),
        "no expiry": (provider.sign({"exp": None}), "exp"),
        "no tenant": (provider.sign({"tenant": None}), "names no tenant"),
        "a key it does not publish": (provider.sign({}, key=_rsa()), "signature"),
        "an unpublished key id": (provider.sign({}, kid="k9", key=_rsa()), "'k9'"),
        "unsigned": (
            jwt.encode({"iss": provider.issuer, "aud": AUDIENCE, "sub": "x"}, None, "none"),
            "'none'",
        ),
        # the public key used as an HMAC secret: an algorithm-confusion forgery
        "HMAC with the public key": (
            _hmac_token(public_pem, provider.issuer, now),
            "'hs256'",
        ),
        "not a JWT": ("a.b.c", "not a jwt"),
    }
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for case, (token, reason) in refused.items():
                response = await http.get("/v1/runs", headers=bearer(token))
                error = error_of(response, 401, "unauthenticated")
                assert reason in str(error["message"]).lower(), (case, error)


def _hmac_token(secret: bytes, issuer: str, now: int) -> str:
    claims = {"iss": issuer, "aud": AUDIENCE, "sub": "x", "tenant": "acme", "exp": now + 60}
    header = {"alg": "HS256", "typ": "JWT", "kid": "k1"}
    segments = [_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode())]
    signing = ".".join(segments).encode()
    return ".".join([*segments, _b64(hmac.new(secret, signing, hashlib.sha256).digest())])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def oidc_only(tmp_path: Path, provider: Provider, refresh_s: float) -> ApiConfig:
    oidc = OidcConfig(issuer=provider.issuer, audience=AUDIENCE, refresh_s=refresh_s)
    return ApiConfig(store=f"sqlite:///{tmp_path}/runs.db", oidc=oidc)


async def test_a_rotated_key_is_fetched_when_a_token_names_it(
    provider: Provider, tmp_path: Path
) -> None:
    with serving(oidc_only(tmp_path, provider, refresh_s=0)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            ok = await http.get("/v1/runs", headers=bearer(provider.sign({})))
            assert ok.status_code == 200, ok.text
            provider.keys["k2"] = _rsa()  # the provider rotates: a new key is published
            rotated = await http.get("/v1/runs", headers=bearer(provider.sign({}, kid="k2")))
            assert rotated.status_code == 200, rotated.text
            again = await http.get("/v1/runs", headers=bearer(provider.sign({}, kid="k1")))
            assert again.status_code == 200, again.text
    assert provider.key_requests == 2


async def test_made_up_key_ids_do_not_make_the_server_fetch_the_keys_again(
    provider: Provider, tmp_path: Path
) -> None:
    stranger = _rsa()
    with serving(oidc_only(tmp_path, provider, refresh_s=3600)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            ok = await http.get("/v1/runs", headers=bearer(provider.sign({})))
            assert ok.status_code == 200, ok.text
            for i in range(20):
                token = provider.sign({}, kid=f"made-up-{i}", key=stranger)
                refused = await http.get("/v1/runs", headers=bearer(token))
                error = error_of(refused, 401, "unauthenticated")
                assert f"made-up-{i}" in str(error["message"])
    assert provider.key_requests == 1


async def test_an_unreachable_provider_answers_503_not_401(tmp_path: Path) -> None:
    idp = Provider()  # never served: its port is closed
    idp.server.server_close()
    config = ApiConfig(
        store=f"sqlite:///{tmp_path}/runs.db",
        oidc=OidcConfig(issuer=idp.issuer, audience=AUDIENCE),
    )
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            response = await http.get("/v1/runs", headers=bearer(idp.sign({})))
            error = error_of(response, 503, "issuer_unreachable")
            assert idp.issuer in str(error["message"])


def test_a_provider_without_an_audience_or_with_a_shared_secret_algorithm_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs an audience"):
        OidcConfig(issuer="https://id.example", audience="")
    with pytest.raises(ConfigError, match="public-key algorithm"):
        OidcConfig(issuer="https://id.example", audience="api", algorithms=("RS256", "HS256"))
