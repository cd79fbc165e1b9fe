"""What the routes share: how the server serves (`ApiConfig`) and the `Api` they act on."""

from __future__ import annotations

from dataclasses import dataclass

from contextos import Agent, ConfigError, Principal, Runtime, Workflow, load_runnable
from contextos.api.errors import ApiError
from contextos.api.oidc import OidcConfig, OidcVerifier
from contextos.workers import SIGNATURE_TOLERANCE_S

MAX_SEQ = 2**63 - 1
"""The largest seq a request may name (a 64-bit integer in every store)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiConfig:
    """How `contextos serve` serves."""

    store: str | None = None
    """Store URL (None: $CONTEXTOS_STORE, else ./.contextos/contextos.db)."""
    agents: tuple[str, ...] = ()
    """Agent references `POST /v1/runs` may start, named by reference or by agent name."""
    any_agent: bool = False
    """Start any importable agent reference a client names (trusted clients only)."""
    token: str | None = None
    """One shared bearer token that acts as the local operator (None: each request carries
    its own token from `contextos token create`)."""
    open_access: bool = False
    """Requests without a token act as the local operator (a server only you can reach)."""
    oidc: OidcConfig | None = None
    """Also accept tokens this OpenID Connect provider signed, as the users they name."""
    worker: bool = False
    """Also drive queued runs inside the server process."""
    worker_concurrency: int = 4
    """Runs that in-process worker drives at once."""
    policy: str | None = None
    """Policy file for approvals (None: $CONTEXTOS_POLICY)."""
    max_wait_s: float = 300.0
    """The longest `?wait=true&timeout=` a client may ask for."""
    max_body_bytes: int = 1 << 20
    """The largest request body accepted (413 beyond, before it is read whole)."""
    webhook_tolerance_s: float = SIGNATURE_TOLERANCE_S
    """How far a signed webhook delivery's timestamp may be from the server's clock."""


class Api:
    """What the routes share: the runtime, the configuration, the agents allowed."""

    def __init__(
        self, config: ApiConfig, runtime: Runtime, agents: dict[str, Agent | Workflow]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.agents = dict(agents)
        """Loaded agents and workflows by reference (also the webhook triggers' cache)."""
        self.operator = Principal.local()
        """Who a request acts as under the shared token or open access."""
        self.oidc = OidcVerifier(config.oidc) if config.oidc is not None else None
        """The verifier of single sign-on tokens, if the server accepts them."""
        self.allowed: dict[str, str] = {}
        """Allowed agent reference or name -> reference."""
        for ref, agent in agents.items():
            self.allowed[ref] = ref
            self.allowed.setdefault(agent.name, ref)

    def agent(self, name: str) -> tuple[str, Agent | Workflow]:
        """The reference and agent (or workflow) a client asked for, if this server may start
        it."""
        ref = name if self.config.any_agent else self.allowed.get(name)
        if ref is None:
            served = ", ".join(sorted(self.allowed)) or "none"
            raise ApiError(
                422,
                "unknown_agent",
                f"this server does not start agent {name!r} (it starts: {served})",
                hint="Name one of those, or restart `contextos serve` with --agent REF.",
                agent=name,
            )
        agent = self.agents.get(ref)
        if agent is None:
            try:
                agent = self.agents[ref] = load_runnable(ref)
            except ConfigError as exc:
                raise ApiError(
                    422,
                    "unknown_agent",
                    exc.message,
                    hint="Use path/to/file.py:attr or package.module:attr, importable by the "
                    "server and the workers.",
                    agent=name,
                ) from exc
        return ref, agent


__all__ = ["MAX_SEQ", "Api", "ApiConfig"]
