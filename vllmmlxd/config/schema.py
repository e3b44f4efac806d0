"""The configuration schema: frozen pydantic models, unknown keys forbidden. The model entries
have their own module (``entries``: the kinds, and what the daemon resolves into them), and so
do the sections beside them: ``keys`` (api_keys) and ``mcp`` (mcp_servers).

``Config`` validates a whole file and resolves each entry: the api_keys section into its key
grants, the MCP servers it names into their definitions, the gateway's token.
"""

from __future__ import annotations

import functools
import secrets
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from .base import Strict as _Strict
from .entries import (  # noqa: F401 - the entry kinds are imported from here too
    INTERNAL_FIELDS,
    Entry,
    EntryConfig,
    ModelConfig,
    Resolved,
    ResolvedModel,
    ResolvedUpstream,
    UpstreamConfig,
    resolve,
)
from .gateway import GatewayConfig
from .groups import check_groups, members_by_group
from .keys import ApiKeyConfig, KeyGrant
from .mcp import MCP_TOOL_SEPARATOR, McpServerConfig, check_mcp_server_names, load_mcp_file
from .names import BLAS_NAMES, BUILTIN_MODELS, BUILTIN_PREFIX, REASONING_PARSERS, TOOL_PARSERS  # noqa: F401
from .names import NAME_RE as MODEL_NAME_RE
from .tracing import TracingConfig


def _ring_ports_apart(models: dict[str, EntryConfig], listening: dict[tuple[str, int], str]) -> None:
    """A distributed entry's ranks listen on port + rank of their address: not where anything else does."""
    taken = dict(listening)
    for name, entry in models.items():
        dist = getattr(entry, "distributed", None)
        if dist is None:
            continue
        for rank, (address, port) in enumerate(dist.ring_ports()):
            other = taken.get((address, port)) or (taken.get(("0.0.0.0", port)) if dist.hosts[rank].local else None)
            if other is not None:
                what = "the gateway" if other == "gateway" else repr(other.split("#")[0])
                raise ValueError(
                    f"{name!r} rank {rank} listens on {address}:{port}, where {what} does too: "
                    "set distributed.port to a free range"
                )
            taken[(address, port)] = f"{name}#{rank}"


@functools.cache
def gateway_token() -> SecretStr:
    """The token between this daemon's gateway and its workers, made once per process (a daemon's run).
    With it the gateway says who its client is (rate limits count per client, not per gateway);
    without it a request from loopback is one more client, whatever its X-Forwarded-For says."""
    return SecretStr(secrets.token_urlsafe(32))


class DaemonConfig(_Strict):
    state_dir: Path | None = None
    control_socket: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_timeout: float = Field(30.0, ge=0)
    watch: bool = True
    memory_reserve_mb: int = Field(2048, ge=0, description="memory left to the system; the models must fit in the rest")
    max_pulls: int = Field(2, ge=1, description="downloads into the model store running at once; more wait their turn")
    max_waiting_pulls: int = Field(8, ge=0, description="downloads waiting for a turn at most; more are refused (503)")


class Config(_Strict):
    """A whole config file."""

    daemon: DaemonConfig = DaemonConfig()
    # Declared before api_keys and models: their validators check the server names they give.
    mcp_config: Path | None = Field(None, description="a Claude-Desktop-style mcpServers JSON file, imported as is")
    mcp_servers: dict[str, McpServerConfig] = Field(
        default_factory=dict, validate_default=True
    )  # the import runs without it
    api_keys: dict[str, ApiKeyConfig] = Field(default_factory=dict)
    gateway: GatewayConfig | None = Field(None, description="one address for every model, with the web page")
    telemetry: TracingConfig | None = Field(None, description="OpenTelemetry traces of every request (OTLP)")
    models: dict[str, Entry] = Field(default_factory=dict)  # resolved when valid: ResolvedModel, ResolvedUpstream

    @model_validator(mode="before")
    @classmethod
    def _no_internal_fields(cls, data: Any) -> Any:  # written by hand, they would only be an "unknown key": say why
        models = data.get("models") if isinstance(data, dict) else None
        for name, entry in models.items() if isinstance(models, dict) else ():
            for field_name in INTERNAL_FIELDS & set(entry if isinstance(entry, dict) else ()):
                raise ValueError(f"models.{name}.{field_name} is filled in by vllmmlxd (from api_keys, mcp); remove it")
        return data

    @field_validator("mcp_config")
    @classmethod
    def _readable_mcp_file(cls, v: Path | None) -> Path | None:
        if v is not None:
            load_mcp_file(v)  # its errors are this key's
        return v

    @field_validator("mcp_servers")
    @classmethod
    def _import_mcp_file(cls, servers: dict[str, McpServerConfig], info: ValidationInfo) -> dict[str, McpServerConfig]:
        check_mcp_server_names(servers)
        path = info.data.get("mcp_config")
        imported = load_mcp_file(path) if path is not None else {}
        for name in sorted(imported.keys() & servers.keys()):
            raise ValueError(f"MCP server {name!r} is defined here and in mcp_config {path}; rename one")
        return {**servers, **imported}

    @field_validator("api_keys")
    @classmethod
    def _key_names(cls, keys: dict[str, ApiKeyConfig], info: ValidationInfo) -> dict[str, ApiKeyConfig]:
        for name in keys:
            if not MODEL_NAME_RE.match(name) or name == "api_key":
                raise ValueError(f"key name {name!r} must be letters, digits, '_', '.' or '-' (and not 'api_key')")
        servers = info.data.get("mcp_servers") or {}
        for name, key in keys.items():
            for i, server in enumerate(key.mcp or ()):
                if server not in servers:
                    raise ValueError(
                        f"key {name!r}: mcp[{i}] names an MCP server mcp_servers does not define; "
                        f"defined: {', '.join(sorted(servers)) or 'none'}"
                    )
        return keys

    @field_validator("models")
    @classmethod
    def _names_and_ports(cls, models: dict[str, EntryConfig], info: ValidationInfo) -> dict[str, EntryConfig]:
        gateway: GatewayConfig | None = info.data.get("gateway")
        seen: dict[tuple[str, int], str] = {addr: "gateway" for addr in gateway.listeners()} if gateway else {}
        for name, entry in models.items():
            if not MODEL_NAME_RE.match(name):
                raise ValueError(f"model name {name!r} must be letters, digits, '_', '.' or '-'")
            if not isinstance(entry, ModelConfig):  # an upstream listens nowhere here
                continue
            addr = (entry.host, entry.port)
            if addr in seen:
                first = "the gateway" if seen[addr] == "gateway" else f"models {seen[addr]!r}"
                raise ValueError(f"{first} and {name!r} both listen on {entry.host}:{entry.port}")
            seen[addr] = name
        _ring_ports_apart(models, seen)
        return models

    @field_validator("models")
    @classmethod
    def _replica_sets(cls, models: dict[str, EntryConfig], info: ValidationInfo) -> dict[str, EntryConfig]:
        gateway = info.data.get("gateway")
        check_groups(models, gateway is not None)
        unknown = set(gateway.groups) - set(members_by_group(models)) if gateway is not None else set()
        if unknown:  # a group's name is a value: counted, never shown
            raise ValueError(f"gateway.groups has {len(unknown)} name(s) that no model's group is")
        return models

    @field_validator("models")
    @classmethod
    def _grant_keys(cls, models: dict[str, EntryConfig], info: ValidationInfo) -> dict[str, Resolved]:
        # Each entry gets every named key's digest, marked allowed or not: a known key that
        # may not use a model is a 403 there, an unknown one a 401.
        keys: dict[str, ApiKeyConfig] = info.data.get("api_keys") or {}
        out: dict[str, Resolved] = {}
        for name, entry in models.items():
            if entry.api_keys is None:  # open (or only its own api_key): the key table is not needed
                out[name] = resolve(entry)
                continue
            listed = set(entry.api_keys)
            for i, key_name in enumerate(entry.api_keys):
                if key_name != "*" and key_name not in keys:  # named by place: an unknown name is only a value
                    known = ", ".join(sorted(keys)) or "none (add an api_keys section)"
                    raise ValueError(
                        f"model {name!r}: api_keys[{i}] names a key the api_keys section does not "
                        f"define; defined: {known}"
                    )
            for key_name in sorted(listed - {"*"}):
                if not keys[key_name].may_use(name):
                    raise ValueError(
                        f"model {name!r} names key {key_name!r}, whose models ({', '.join(keys[key_name].models)}) exclude it"
                    )
            grants = tuple(
                KeyGrant(
                    name=key_name,
                    sha256=k.key_sha256,
                    rate_limit=k.rate_limit,
                    tokens_per_minute=k.tokens_per_minute,
                    allowed=key_name in listed or ("*" in listed and k.may_use(name)),
                    mcp=k.mcp,
                    budget=k.budget,
                )
                for key_name, k in keys.items()
            )
            out[name] = resolve(entry, key_grants=grants)
        return out

    @field_validator("models")
    @classmethod
    def _resolve_mcp(cls, models: dict[str, Resolved], info: ValidationInfo) -> dict[str, Resolved]:
        # Each entry carries the full definitions of its servers (the names it lists, and all of
        # its own mcp_config file's): a worker never sees the rest of the config.
        servers: dict[str, McpServerConfig] = info.data.get("mcp_servers") or {}
        out: dict[str, Resolved] = {}
        for name, entry in models.items():
            if not isinstance(entry, ResolvedModel):
                out[name] = entry
                continue
            for i, server in enumerate(entry.mcp):
                if server not in servers:
                    raise ValueError(
                        f"model {name!r}: mcp[{i}] names an MCP server mcp_servers does not define; "
                        f"defined: {', '.join(sorted(servers)) or 'none'}"
                    )
            own = load_mcp_file(entry.mcp_config) if entry.mcp_config else {}
            resolved = {**{s: servers[s] for s in entry.mcp}, **own}
            for i, pattern in enumerate(entry.mcp_auto_execute):
                server = pattern.split(MCP_TOOL_SEPARATOR, 1)[0]
                if pattern != "*" and not any(c in server for c in "*?[") and server not in resolved:
                    raise ValueError(
                        f"model {name!r}: mcp_auto_execute[{i}] names an MCP server the model does not "
                        f"use; it uses: {', '.join(sorted(resolved)) or 'none (add mcp or mcp_config)'}"
                    )
            out[name] = resolve(entry, mcp_servers_resolved=resolved) if resolved else entry
        return out

    @field_validator("models")
    @classmethod
    def _telemetry(cls, models: dict[str, Resolved], info: ValidationInfo) -> dict[str, Resolved]:
        # Daemon-wide: each worker exports its own spans where the section says.
        telemetry = info.data.get("telemetry")
        if telemetry is None:
            return models
        return {name: resolve(entry, telemetry=telemetry) for name, entry in models.items()}

    @field_validator("models")
    @classmethod
    def _gateway_token(cls, models: dict[str, Resolved], info: ValidationInfo) -> dict[str, Resolved]:
        # With a gateway, the workers believe the client address it passes on with the daemon's token.
        if info.data.get("gateway") is None:
            return models
        token = gateway_token()
        return {
            name: resolve(entry, gateway_token=token) if isinstance(entry, ResolvedModel) else entry
            for name, entry in models.items()
        }

    @model_validator(mode="after")
    def _gateway_routes(self) -> Self:
        # Through the gateway a name must lead to one model (said of the whole file: checked once
        # every entry is read).
        if self.gateway is None:
            return self
        owner: dict[str, str] = {}
        for name, entry in self.models.items():
            names = {entry.display_name(name), name, *entry.aliases}
            for n in sorted(names):
                if owner.setdefault(n, name) != name:
                    raise ValueError(
                        f"models {owner[n]!r} and {name!r} both answer to {n!r}: the gateway routes by "
                        "name, so served_model_name, entry keys and aliases must differ"
                    )
        return self
