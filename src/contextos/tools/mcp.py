"""Tools from MCP servers, through the official MCP Python SDK, as ordinary contracts.

An MCP server's tool annotations are hints from a party we do not control: they only set the
defaults of a contract (`readOnlyHint` -> read, `destructiveHint` -> irreversible or write,
`idempotentHint` -> idempotent), with the protocol's own conservative defaults when they are
absent (not read-only, destructive, not idempotent). Local `McpToolConfig` overrides any of
them. A server's free-text description is shown to the model and hashed into the manifest, and
never read for policy. The resulting `Tool`s go through the same gateway and effect ledger as
local ones.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from contextos.errors import ConfigError, ToolError, ToolOutcomeUnknown
from contextos.tools.contract import Effect, RetryPolicy, Risk, Tool, ToolContext

IDEMPOTENCY_META_KEY = "io.contextos/idempotency-key"
"""Request `_meta` entry carrying the effect's idempotency key to servers that honour one."""


class McpToolError(ToolError):
    """The MCP server answered the call with an error result."""

    code = "mcp_tool_error"


@dataclass(frozen=True, kw_only=True, slots=True)
class McpToolConfig:
    """Local decisions about one MCP tool; every field set here beats the server's hints."""

    effect: Effect | str | None = None
    """Declared effect, instead of the one derived from the annotations."""
    risk: Risk | str | None = None
    """Declared risk."""
    idempotent: bool | None = None
    """Whether re-sending a call with the same arguments is safe."""
    scopes: tuple[str, ...] = ()
    """Scopes a principal needs to call it."""
    data_classification: str = "internal"
    """Classification of its data."""
    timeout_s: float | None = None
    """Per-attempt time limit."""
    retry: RetryPolicy | None = None
    """When failed calls may be retried."""
    reconcile: Callable[[str], Any] | None = None
    """Look-up of a call by idempotency key, when the service behind the server offers one."""
    compensation: str | None = None
    """Tool that undoes a committed call."""
    approval_policy: str | None = None
    """Reference to the approval policy that governs it."""
    enabled: bool = True
    """False hides the tool from runs."""


@dataclass(kw_only=True)
class McpServer:
    """One MCP server: connect, list its tools as contracts, call them.

    ```python
    async with McpServer.stdio("git", "uvx", ["mcp-server-git"]) as git:
        agent = Agent(name="dev", model=..., tools=git.tools)
    ```
    """

    name: str
    """Local name of the server; tools are recorded with source `mcp:<name>`."""
    target: Any
    """What the SDK's `Client` connects to: StdioServerParameters, a URL, or a server object."""
    config: Mapping[str, McpToolConfig] = field(default_factory=dict)
    """Per-tool local configuration, by the server's tool name."""
    prefix: str = ""
    """Prepended to every tool name (to keep two servers' names apart)."""
    timeout_s: float = 30.0
    """Default per-attempt time limit of its tools."""
    tools: list[Tool] = field(default_factory=list, init=False)
    """The server's tools as contracts (filled on connect)."""
    server_info: dict[str, Any] = field(default_factory=dict, init=False)
    """Name and version the server reported."""
    _client: Any = field(default=None, init=False, repr=False)
    _stack: AsyncExitStack | None = field(default=None, init=False, repr=False)

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> McpServer:
        """A server started as a subprocess, spoken to over its stdin and stdout."""
        from mcp import StdioServerParameters

        params = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
        )
        return cls(name=name, target=params, **options)

    @classmethod
    def http(cls, name: str, url: str, **options: Any) -> McpServer:
        """A server reached over streamable HTTP at `url` (for example http://host/mcp)."""
        return cls(name=name, target=url, **options)

    async def __aenter__(self) -> McpServer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        try:
            from mcp import Client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("MCP tools need the MCP SDK: pip install 'contextos[mcp]'") from exc
        stack = AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(Client(self.target))
            listed = await self._list()
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        info = self._client.server_info
        if info is not None:
            self.server_info = {"name": info.name, "version": info.version}
        self.tools = [t for t in (self._contract(d) for d in listed) if t is not None]

    async def close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()

    async def _list(self) -> list[Any]:
        out: list[Any] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends must not hang the connect
            page = await self._client.list_tools(cursor=cursor)
            out.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return out

    def _contract(self, described: Any) -> Tool | None:
        conf = self.config.get(described.name, McpToolConfig())
        if not conf.enabled:
            return None
        effect, risk, idempotent = contract_defaults(described.annotations)
        schema = dict(described.input_schema or {"type": "object"})
        return Tool(
            name=f"{self.prefix}{described.name}",
            description=described.description or described.title or described.name,
            fn=self._caller(described.name),
            args_model=schema_model(described.name, schema),
            effect=Effect(conf.effect) if conf.effect is not None else effect,
            risk=Risk(conf.risk) if conf.risk is not None else risk,
            idempotent=conf.idempotent if conf.idempotent is not None else idempotent,
            scopes=conf.scopes,
            data_classification=conf.data_classification,
            output_schema=getattr(described, "output_schema", None),
            timeout_s=conf.timeout_s or self.timeout_s,
            retry=conf.retry or RetryPolicy(),
            reconcile=conf.reconcile,
            compensation=conf.compensation,
            approval_policy=conf.approval_policy,
            source=f"mcp:{self.name}",
            context_param="_ctx",
        )

    def _caller(self, remote_name: str) -> Callable[..., Awaitable[Any]]:
        async def call(_ctx: ToolContext, **arguments: Any) -> Any:
            return await self.call(remote_name, arguments, _ctx)

        return call

    async def call(self, remote_name: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Call one tool on the server; an error result raises McpToolError."""
        from mcp import MCPError

        if self._client is None:
            raise ToolOutcomeUnknown(f"MCP server {self.name} is not connected")
        meta = {IDEMPOTENCY_META_KEY: ctx.idempotency_key} if ctx.effect_id else None
        try:
            result = await self._client.call_tool(remote_name, arguments, meta=meta)
        except MCPError as exc:
            raise McpToolError(f"{remote_name}: {exc}", server=self.name) from exc
        except (OSError, EOFError) as exc:
            raise ToolOutcomeUnknown(f"connection to MCP server {self.name} failed: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("anyio"):  # the stream to the server broke
                raise ToolOutcomeUnknown(f"MCP server {self.name}: {exc!r}") from exc
            raise
        text = render_content(result)
        if result.is_error:
            raise McpToolError(text or f"{remote_name} failed", server=self.name)
        return text


def contract_defaults(annotations: Any) -> tuple[Effect, Risk, bool]:
    """Effect, risk and idempotency from MCP tool annotations (the protocol's defaults)."""
    read_only = bool(getattr(annotations, "read_only_hint", None) or False)
    destructive = getattr(annotations, "destructive_hint", None)
    idempotent = bool(getattr(annotations, "idempotent_hint", None) or False)
    if read_only:
        return Effect.READ, Risk.LOW, True
    if destructive is None or destructive:
        return Effect.IRREVERSIBLE, Risk.HIGH, idempotent
    return Effect.WRITE, Risk.MEDIUM, idempotent


class _SchemaArgs(BaseModel):
    """Arguments checked against a JSON schema the server published."""

    model_config = ConfigDict(extra="allow")
    json_schema: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        import jsonschema  # type: ignore[import-untyped,unused-ignore]

        try:
            jsonschema.validate(data, cls.json_schema)
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ValueError(f"{where}: {exc.message}") from None
        except jsonschema.SchemaError:
            pass  # a server's broken schema must not make its tool uncallable
        return data

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(cls.json_schema)


def schema_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A Pydantic model whose validation and schema are the server's JSON schema."""
    return type(f"{name.replace('-', '_')}_args", (_SchemaArgs,), {"json_schema": schema})


def render_content(result: Any) -> str:
    """The result's content as text; structured content when the server gave some."""
    if getattr(result, "structured_content", None) is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', 'unknown type')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            parts.append(f"[resource: {getattr(block.resource, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    return "\n".join(parts)
