"""The HTTP API (`contextos serve`): runs, their events, interrupts and webhook triggers.

Needs the `api` extra: `pip install 'contextos[api]'`.
"""

from contextos.api.app import API_VERSION, ApiConfig, create_app, serve, token_from_env
from contextos.api.oidc import OidcConfig

__all__ = ["API_VERSION", "ApiConfig", "OidcConfig", "create_app", "serve", "token_from_env"]
