"""The configuration schema: frozen pydantic models, unknown keys forbidden. The sections
beside the models have their own modules: ``keys`` (api_keys) and ``mcp`` (mcp_servers).

``ModelConfig`` is also the contract between the daemon and a worker: the daemon
sends a worker its entry as JSON, and ``vllmmlxd serve`` builds one from flags.
Option names mirror the reference server's flags in snake_case.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from .base import Strict as _Strict
from .gateway import GatewayConfig
from .keys import DIGEST_PREFIX, SHA256_RE, ApiKeyConfig, KeyGrant, check_rate, key_digest
from .mcp import MCP_TOOL_SEPARATOR, McpServerConfig, check_mcp_server_names, load_mcp_file

BLAS_NAMES = ("auto", "mkl", "blis", "openblas", "bundled")
REASONING_PARSERS = ("qwen3", "deepseek_r1")  # as vllmmlxd/parsers/reasoning has them (a test keeps them equal)
TOOL_PARSERS = (  # as vllmmlxd/parsers/tools has them (a test keeps them equal)
    "auto", "deepseek", "functionary", "glm47", "granite", "hermes", "kimi", "llama", "mistral", "nemotron", "qwen", "xlam",
)
BUILTIN_MODELS = (  # as vllmmlxd/engine/builtin.py has them (a test keeps them equal; config never imports the engine)
    "all-minilm-l6-v2", "smollm2-135m-instruct", "tiny",
)
BUILTIN_PREFIX = "builtin:"
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Fields vllmmlxd fills itself (from the top-level api_keys section): never written by hand.
INTERNAL_FIELDS = frozenset({"key_grants", "mcp_servers_resolved", "gateway_token"})


@functools.cache
def gateway_token() -> SecretStr:
    """The token between this daemon's gateway and its workers, made once per process (a daemon's run).
    With it the gateway says who its client is (rate limits count per client, not per gateway);
    without it a request from loopback is one more client, whatever its X-Forwarded-For says."""
    return SecretStr(secrets.token_urlsafe(32))


class ModelConfig(_Strict):
    """One model entry: what to load, where to listen and how to serve it."""

    model: str | None = Field(None, description="builtin:NAME, a .gguf path, a local MLX folder or a Hugging Face repo id")
    # Where the model runs: here (model) or on another host's daemon (upstream), and when it loads.
    upstream: str | None = Field(None, description="the base URL of a model served by another host (http://host:port)")
    upstream_api_key: SecretStr | None = Field(None, description="the key sent to the upstream host (Bearer)")
    load: Literal["eager", "lazy"] = Field("eager", description="eager: at start; lazy: on the first request through the gateway")
    idle_unload_s: float | None = Field(None, gt=0, description="lazy models: stop after this long without a request")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    served_model_name: str | None = None
    aliases: tuple[str, ...] = ()
    owned_by: str = "vllmmlxd"
    api_key: SecretStr | None = None
    api_keys: tuple[str, ...] | None = Field(
        None, description="names from the api_keys section allowed here ('*': every key whose models match); unset: open"
    )
    key_grants: tuple[KeyGrant, ...] = ()  # INTERNAL_FIELDS: the api_keys section, resolved for this entry
    gateway_token: SecretStr | None = None  # INTERNAL_FIELDS: set with a gateway section (gateway_token())
    timeout: float = Field(300.0, gt=0)
    max_tokens: int = Field(32768, ge=1)
    max_request_tokens: int = Field(32768, ge=1)
    default_temperature: float | None = Field(None, ge=0, le=2)
    default_top_p: float | None = Field(None, gt=0, le=1)
    stream_interval: int = Field(1, ge=1)
    max_queue: int = Field(64, ge=1, description="requests waiting for the engine before 503")
    max_body_mb: float = Field(16.0, gt=0, description="request bodies above this get 413")
    trust_remote_code: bool = False
    rate_limit: int | str = Field(0, description="requests per client (key name, else address): per minute, or text like '120/minute'; 0: off")
    tokens_per_minute: int = Field(0, ge=0, description="generated tokens per minute per client; 0: no limit")
    trusted_proxies: tuple[str, ...] = Field((), description="proxy addresses/networks whose X-Forwarded-For names the client")
    allowed_hosts: tuple[str, ...] = Field((), description="Host names this server answers besides its bind address and localhost")
    cors_origins: tuple[str, ...] = Field((), description="web origins allowed to call the API from a browser; none by default")
    max_connections: int = Field(256, ge=1, description="open connections at most; more get 503")
    health_requires_key: bool = Field(False, description="put /health behind the key check too")
    metrics_requires_key: bool = Field(False, description="put /metrics behind the key check too")
    enable_metrics: bool = False
    blas: str = Field(
        "auto", description="Linux: auto, mkl, blis, openblas, bundled or a path to a library exporting cblas_sgemm"
    )
    threads: int | None = Field(None, ge=1, le=1024, description="BLAS threads (and cores on Linux); default: an even share")
    # The scheduler: requests decoded together, and the prefix cache's byte budget.
    continuous_batching: bool = Field(True, description="decode many requests together; false: one at a time")
    max_num_seqs: int = Field(16, ge=1, le=1024, description="requests decoded together at most (then they queue)")
    prefill_step_size: int = Field(512, ge=16, le=65536, description="prompt tokens prefilled in one step at most")
    use_paged_cache: bool = Field(False, description="accepted for reference configs: the prefix cache is always on")
    cache_memory_mb: int | None = Field(None, ge=0, description="prefix cache budget in MB (0: no cache); unset: cache_memory_percent")
    cache_memory_percent: float = Field(0.20, gt=0, le=1, description="prefix cache budget as a fraction of physical memory")
    reasoning_parser: str | None = Field(None, description="qwen3 or deepseek_r1: return reasoning apart from the answer")
    strict_model_name: bool = Field(False, description="404 for a request naming another model; default: answer it")
    tool_call_parser: str = Field("auto", description="the model's tool-call format: auto (from its chat template, else hermes) or a family")
    enable_auto_tool_choice: bool = Field(True, description="read the model's own tool calls (tool_choice auto); false: only forced calls")
    embedding_model: str | None = Field(
        None, description="an embedding model preloaded beside the model, served on /v1/embeddings: "
        "builtin:all-minilm-l6-v2 or a local BERT sentence-transformers folder")
    # MCP: servers from the top-level mcp_servers section (or an mcpServers file) this worker connects to.
    mcp: tuple[str, ...] = Field((), description="names from mcp_servers whose tools this model's worker offers")
    mcp_auto_execute: tuple[str, ...] = Field((), description="tools the worker runs itself: "
                                          "SERVER__TOOL (shell patterns), or a server's name for all its tools")
    mcp_max_tool_calls: int = Field(8, ge=0, le=1000, description="tool executions one request may make at most")
    mcp_config: str | None = Field(None, description="a Claude-Desktop-style mcpServers JSON file: all its servers")
    mcp_servers_resolved: dict[str, McpServerConfig] = Field(default_factory=dict)  # INTERNAL_FIELDS: mcp, resolved

    # Messages name the key and what it accepts, never the value given: a value may come from
    # ${file:..} or ${env:..} and be a secret written under the wrong key.
    @field_validator("blas")
    @classmethod
    def _blas_choice(cls, v: str):
        # A path need not exist here: a missing library falls back to the bundled BLAS with a warning.
        if v not in BLAS_NAMES and "/" not in v and not v.endswith((".so", ".dylib")) and ".so." not in v:
            raise ValueError(f"blas must be one of {', '.join(BLAS_NAMES)} or a path to a shared library")
        return v

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, v):
        if v is not None and v not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}")
        return v

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, v):
        if v not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_PARSERS)}")
        return v

    @field_validator("model", "embedding_model")
    @classmethod
    def _known_builtin(cls, v: str | None):
        # Refused here rather than at load: `vllmmlxctl check` and a reload see it before a worker starts.
        if v is not None and v.startswith(BUILTIN_PREFIX) and v[len(BUILTIN_PREFIX):] not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            raise ValueError(f"unknown builtin model; the builtins are {known}")
        return v

    @field_validator("aliases", "api_keys", "trusted_proxies", "allowed_hosts", "cors_origins", "mcp",
                     "mcp_auto_execute", mode="before")
    @classmethod
    def _one_is_a_list(cls, v):
        return (v,) if isinstance(v, str) else v

    @field_validator("api_key")
    @classmethod
    def _keep_the_digest(cls, v: SecretStr | None):
        # Only the digest is kept, as "sha256:HEX" (still a SecretStr, so never printed).
        if v is None:
            return v
        text = v.get_secret_value()
        if not text:
            raise ValueError("api_key is empty")
        if text.startswith(DIGEST_PREFIX) and SHA256_RE.match(text[len(DIGEST_PREFIX):]):
            return v
        return SecretStr(DIGEST_PREFIX + key_digest(text))

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, v):
        return check_rate(v)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v):
        import ipaddress

        for i, net in enumerate(v):
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies[{i}] is not an IP address or network") from None
        return v

    @field_validator("mcp_auto_execute")
    @classmethod
    def _tool_patterns(cls, v):
        # A bare server name means all of its tools (those its allow_tools / deny_tools let through):
        # written as SERVER__* here, so the worker matches one form of pattern.
        return tuple(p if MCP_TOOL_SEPARATOR in p or p == "*" else p + MCP_TOOL_SEPARATOR + "*" for p in v)

    @model_validator(mode="after")
    def _mcp_file_alone(self):
        # `vllmmlxd serve --mcp-config FILE`: no config section resolves the servers, the entry does.
        # (In a config file, Config fills mcp_servers_resolved and this finds it already set.)
        if self.mcp_config and not self.mcp_servers_resolved:
            object.__setattr__(self, "mcp_servers_resolved", load_mcp_file(self.mcp_config))
        return self

    @field_validator("upstream")
    @classmethod
    def _upstream_url(cls, v: str | None):
        if v is None:
            return v
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("upstream must be a base URL like http://studio-2.local:8001")
        return v.rstrip("/").removesuffix("/v1")

    @model_validator(mode="after")
    def _where_it_runs(self):
        if (self.model is None) == (self.upstream is None):
            raise ValueError("give model (served here) or upstream (served by another host), one of the two")
        if self.upstream is None and self.upstream_api_key is not None:
            raise ValueError("upstream_api_key needs upstream")
        if self.upstream is not None and self.load == "lazy":
            raise ValueError("an upstream entry has nothing to load here: remove load: lazy")
        if self.idle_unload_s is not None and self.load != "lazy":
            raise ValueError("idle_unload_s needs load: lazy (an eager model stays loaded)")
        return self

    @property
    def is_upstream(self) -> bool:
        return self.upstream is not None

    @model_validator(mode="after")
    def _request_cap_covers_default(self):
        # The default follows the cap and the cap the default, when only one of them is written;
        # only a written default above a written cap is a contradiction.
        if self.max_tokens <= self.max_request_tokens:
            return self
        given = self.model_fields_set
        if "max_tokens" not in given:
            object.__setattr__(self, "max_tokens", self.max_request_tokens)
        elif "max_request_tokens" not in given:
            object.__setattr__(self, "max_request_tokens", self.max_tokens)
        else:
            raise ValueError(f"max_tokens ({self.max_tokens}), the default, is larger than max_request_tokens "
                             f"({self.max_request_tokens}), the cap: lower max_tokens or leave it out")
        return self

    @property
    def is_open(self) -> bool:
        """No key is needed here: neither api_key nor api_keys is set."""
        return self.api_key is None and self.api_keys is None

    def key_names(self) -> list[str]:
        """The names of the keys that may use this entry (``api_key`` for the entry's own key)."""
        return (["api_key"] if self.api_key is not None else []) + [g.name for g in self.key_grants if g.allowed]

    def to_worker_json(self) -> str:
        """This entry as JSON with secrets revealed (the key's digest): only ever sent down a worker's stdin pipe."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = self.api_key.get_secret_value()
        data["mcp_servers_resolved"] = {n: s.revealed() for n, s in self.mcp_servers_resolved.items()}
        if self.upstream_api_key is not None:
            data["upstream_api_key"] = self.upstream_api_key.get_secret_value()
        if self.gateway_token is not None:
            data["gateway_token"] = self.gateway_token.get_secret_value()
        return json.dumps(data)

    def config_hash(self) -> str:
        """A short digest of this entry, secrets included (never shown): the daemon compares the
        hash a worker reports with the one it expects, to know which settings it runs."""
        canonical = json.dumps(json.loads(self.to_worker_json()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def display_name(self, key: str) -> str:
        """The name clients see: served_model_name, else the entry's key."""
        return self.served_model_name or key


class DaemonConfig(_Strict):
    state_dir: Path | None = None
    control_socket: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_timeout: float = Field(30.0, ge=0)
    watch: bool = True
    memory_reserve_mb: int = Field(2048, ge=0, description="memory left to the system; the models must fit in the rest")


class Config(_Strict):
    """A whole config file."""

    daemon: DaemonConfig = DaemonConfig()
    # Declared before api_keys and models: their validators check the server names they give.
    mcp_config: Path | None = Field(None, description="a Claude-Desktop-style mcpServers JSON file, imported as is")
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict, validate_default=True)  # the import runs without it
    api_keys: dict[str, ApiKeyConfig] = Field(default_factory=dict)
    gateway: GatewayConfig | None = Field(None, description="one address for every model, with the web page")
    models: dict[str, ModelConfig] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_internal_fields(cls, data):
        models = data.get("models") if isinstance(data, dict) else None
        for name, entry in models.items() if isinstance(models, dict) else ():
            for field_name in INTERNAL_FIELDS & set(entry if isinstance(entry, dict) else ()):
                raise ValueError(f"models.{name}.{field_name} is filled in by vllmmlxd (from api_keys, mcp); remove it")
        return data

    @field_validator("mcp_config")
    @classmethod
    def _readable_mcp_file(cls, v: Path | None):
        if v is not None:
            load_mcp_file(v)  # its errors are this key's
        return v

    @field_validator("mcp_servers")
    @classmethod
    def _import_mcp_file(cls, servers: dict[str, McpServerConfig], info):
        check_mcp_server_names(servers)
        path = info.data.get("mcp_config")
        imported = load_mcp_file(path) if path is not None else {}
        for name in sorted(imported.keys() & servers.keys()):
            raise ValueError(f"MCP server {name!r} is defined here and in mcp_config {path}; rename one")
        return {**servers, **imported}

    @field_validator("api_keys")
    @classmethod
    def _key_names(cls, keys: dict[str, ApiKeyConfig], info):
        for name in keys:
            if not MODEL_NAME_RE.match(name) or name == "api_key":
                raise ValueError(f"key name {name!r} must be letters, digits, '_', '.' or '-' (and not 'api_key')")
        servers = info.data.get("mcp_servers") or {}
        for name, key in keys.items():
            for i, server in enumerate(key.mcp or ()):
                if server not in servers:
                    raise ValueError(f"key {name!r}: mcp[{i}] names an MCP server mcp_servers does not define; "
                                     f"defined: {', '.join(sorted(servers)) or 'none'}")
        return keys

    @field_validator("models")
    @classmethod
    def _names_and_ports(cls, models: dict[str, ModelConfig], info):
        gateway: GatewayConfig | None = info.data.get("gateway")
        seen: dict[tuple[str, int], str] = {(gateway.host, gateway.port): "gateway"} if gateway else {}
        for name, entry in models.items():
            if not MODEL_NAME_RE.match(name):
                raise ValueError(f"model name {name!r} must be letters, digits, '_', '.' or '-'")
            if entry.is_upstream:  # listens nowhere here
                continue
            addr = (entry.host, entry.port)
            if addr in seen:
                first = "the gateway" if seen[addr] == "gateway" else f"models {seen[addr]!r}"
                raise ValueError(f"{first} and {name!r} both listen on {entry.host}:{entry.port}")
            seen[addr] = name
        return models

    @field_validator("models")
    @classmethod
    def _grant_keys(cls, models: dict[str, ModelConfig], info):
        # Each entry gets every named key's digest, marked allowed or not: a known key that
        # may not use a model is a 403 there, an unknown one a 401.
        keys: dict[str, ApiKeyConfig] = info.data.get("api_keys") or {}
        out = {}
        for name, entry in models.items():
            if entry.api_keys is None:  # open (or only its own api_key): the key table is not needed
                out[name] = entry
                continue
            listed = set(entry.api_keys)
            for i, key_name in enumerate(entry.api_keys):
                if key_name != "*" and key_name not in keys:  # named by place: an unknown name is only a value
                    known = ", ".join(sorted(keys)) or "none (add an api_keys section)"
                    raise ValueError(f"model {name!r}: api_keys[{i}] names a key the api_keys section does not "
                                     f"define; defined: {known}")
            for key_name in sorted(listed - {"*"}):
                if not keys[key_name].may_use(name):
                    raise ValueError(f"model {name!r} names key {key_name!r}, whose models ({', '.join(keys[key_name].models)}) exclude it")
            grants = tuple(
                KeyGrant(name=key_name, sha256=k.key_sha256, rate_limit=k.rate_limit, tokens_per_minute=k.tokens_per_minute,
                         allowed=key_name in listed or ("*" in listed and k.may_use(name)), mcp=k.mcp)
                for key_name, k in keys.items()
            )
            out[name] = entry.model_copy(update={"key_grants": grants})
        return out

    @field_validator("models")
    @classmethod
    def _resolve_mcp(cls, models: dict[str, ModelConfig], info):
        # Each entry carries the full definitions of its servers (the names it lists, and all of
        # its own mcp_config file's): a worker never sees the rest of the config.
        servers: dict[str, McpServerConfig] = info.data.get("mcp_servers") or {}
        out = {}
        for name, entry in models.items():
            for i, server in enumerate(entry.mcp):
                if server not in servers:
                    raise ValueError(f"model {name!r}: mcp[{i}] names an MCP server mcp_servers does not define; "
                                     f"defined: {', '.join(sorted(servers)) or 'none'}")
            own = load_mcp_file(entry.mcp_config) if entry.mcp_config else {}
            resolved = {**{s: servers[s] for s in entry.mcp}, **own}
            for i, pattern in enumerate(entry.mcp_auto_execute):
                server = pattern.split(MCP_TOOL_SEPARATOR, 1)[0]
                if pattern != "*" and not any(c in server for c in "*?[") and server not in resolved:
                    raise ValueError(f"model {name!r}: mcp_auto_execute[{i}] names an MCP server the model does not "
                                     f"use; it uses: {', '.join(sorted(resolved)) or 'none (add mcp or mcp_config)'}")
            out[name] = entry.model_copy(update={"mcp_servers_resolved": resolved}) if resolved or entry.mcp_servers_resolved else entry
        return out

    @model_validator(mode="after")
    def _gateway_routes(self):
        # Through the gateway a name must lead to one model, and the workers believe the
        # client address the gateway passes on with the daemon's token.
        if self.gateway is None:
            return self
        owner: dict[str, str] = {}
        for name, entry in self.models.items():
            names = {entry.display_name(name), name, *entry.aliases}
            for n in sorted(names):
                if owner.setdefault(n, name) != name:
                    raise ValueError(f"models {owner[n]!r} and {name!r} both answer to {n!r}: the gateway routes by "
                                     "name, so served_model_name, entry keys and aliases must differ")
        token = gateway_token()
        models = {name: entry if entry.is_upstream else entry.model_copy(update={"gateway_token": token})
                  for name, entry in self.models.items()}
        object.__setattr__(self, "models", models)
        return self
