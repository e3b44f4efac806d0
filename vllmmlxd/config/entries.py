"""Model entries, one kind per way a model is served, and what the daemon resolves into them.

A user writes an entry of one of two kinds, told apart by the key that says where the model
runs: ``model:`` (served here, ``ModelConfig``) or ``upstream:`` (served by another host's
daemon, ``UpstreamConfig``). Both share ``EntryConfig``: the names clients use, who may call it,
how long a request may take. Lifecycle (``load``, ``idle_unload_s``) and everything about an
engine, a port or a worker belong to the kind served here; an upstream entry that carries such a
key is refused, naming it. Frozen pydantic, unknown keys forbidden, option names as the
reference server's flags in snake_case.

What the daemon computes (the api_keys section's grants, the MCP servers an entry uses, the
gateway's token) is not on these schemas: ``ResolvedModel`` and ``ResolvedUpstream`` carry it,
built by ``Config`` from the sections beside the models. ``ResolvedModel`` is the contract
between the daemon and a worker: sent as JSON on the worker's stdin, or built from flags by
``vllmmlxd serve``.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, SecretStr, Tag, field_validator, model_validator

from .base import Strict as _Strict
from .cache import CacheDiskConfig
from .distributed import DistributedConfig, distributed_problem
from .keys import DIGEST_PREFIX, SHA256_RE, KeyGrant, check_rate, key_digest
from .mcp import MCP_TOOL_SEPARATOR, McpServerConfig, load_mcp_file
from .names import BLAS_NAMES, BUILTIN_MODELS, BUILTIN_PREFIX, REASONING_PARSERS, TOOL_PARSERS, hub_repo_id
from .speculative import SpeculativeConfig

# A vision entry's image settings (live, and flags of `vllmmlxd serve`).
IMAGE_FIELDS = (
    "max_images",
    "max_image_mb",
    "max_image_pixels",
    "max_request_image_pixels",
    "image_pixel_budget",
    "allow_image_urls",
    "allowed_image_hosts",
    "image_url_timeout",
)

# Fields vllmmlxd fills itself (from the sections beside the models): never written by hand.
INTERNAL_FIELDS = frozenset({"key_grants", "mcp_servers_resolved", "gateway_token"})


class EntryConfig(_Strict):
    """What every model entry has, wherever it runs: its names, who may call it, a request's time."""

    served_model_name: str | None = None
    aliases: tuple[str, ...] = ()
    owned_by: str = "vllmmlxd"
    api_key: SecretStr | None = None
    api_keys: tuple[str, ...] | None = Field(
        None,
        description="names from the api_keys section allowed here ('*': every key whose models match); unset: open",
    )
    timeout: float = Field(300.0, gt=0)
    group: str | None = Field(
        None,
        description="a replica set: entries with the same group are answered by the gateway under its name too",
    )
    embedding_model: str | None = Field(
        None,
        description="an embedding model preloaded beside the model, served on /v1/embeddings: "
        "builtin:all-minilm-l6-v2 or a local BERT sentence-transformers folder",
    )

    # Messages name the key and what it accepts, never the value given: a value may come from
    # ${file:..} or ${env:..} and be a secret written under the wrong key.
    @field_validator("embedding_model")
    @classmethod
    def _known_builtin(cls, v: str | None):
        # Refused here rather than at load: `vllmmlxctl check` and a reload see it before a worker starts.
        if v is not None and v.startswith(BUILTIN_PREFIX) and v[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            raise ValueError(f"unknown builtin model; the builtins are {known}")
        return v

    @field_validator("aliases", "api_keys", mode="before")
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
        if text.startswith(DIGEST_PREFIX) and SHA256_RE.match(text[len(DIGEST_PREFIX) :]):
            return v
        return SecretStr(DIGEST_PREFIX + key_digest(text))

    @property
    def is_upstream(self) -> bool:
        """Served by another host (an ``UpstreamConfig``)."""
        return False

    @property
    def is_open(self) -> bool:
        """No key is needed here: neither api_key nor api_keys is set."""
        return self.api_key is None and self.api_keys is None

    def display_name(self, key: str) -> str:
        """The name clients see: served_model_name, else the entry's key."""
        return self.served_model_name or key

    SECRETS: ClassVar[tuple[str, ...]] = ("api_key",)  # revealed in the JSON a worker or the gateway receives

    @property
    def grants(self) -> tuple[KeyGrant, ...]:
        """The api_keys section's keys as this entry knows them (none until resolved)."""
        return ()

    def key_names(self) -> list[str]:
        """The names of the keys that may use this entry (``api_key`` for the entry's own key)."""
        return (["api_key"] if self.api_key is not None else []) + [g.name for g in self.grants if g.allowed]

    def to_worker_json(self) -> str:
        """This entry as JSON with secrets revealed (the key's digest): only ever sent down a worker's stdin pipe."""
        return self._reveal(self.model_dump(mode="json"))

    def _reveal(self, data: dict) -> str:
        for name in self.SECRETS:
            value = getattr(self, name, None)
            if value is not None:
                data[name] = value.get_secret_value()
        return json.dumps(data)

    def config_hash(self) -> str:
        """A short digest of this entry, secrets included (never shown): the daemon compares the
        hash a worker reports with the one it expects, to know which settings it runs."""
        canonical = json.dumps(json.loads(self.to_worker_json()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


ONE_OF_THE_TWO = "give model (served here) or upstream (served by another host), one of the two"


class ModelConfig(EntryConfig):
    """A model served here: what to load, when, where to listen and how to serve it."""

    model: str = Field(description="builtin:NAME, a .gguf path, a local MLX folder or a Hugging Face repo id")
    load: Literal["eager", "lazy"] = Field(
        "eager", description="eager: at start; lazy: on the first request through the gateway"
    )
    idle_unload_s: float | None = Field(None, gt=0, description="lazy models: stop after this long without a request")
    download: bool = Field(
        False,
        description="a Hugging Face repo id not in the model store yet: the daemon downloads it (status shows "
        "its progress) instead of refusing it with the `vllmmlxctl pull` to run",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_tokens: int = Field(32768, ge=1)
    max_request_tokens: int = Field(32768, ge=1)
    default_temperature: float | None = Field(None, ge=0, le=2)
    default_top_p: float | None = Field(None, gt=0, le=1)
    stream_interval: int = Field(1, ge=1)
    max_queue: int = Field(64, ge=1, description="requests waiting for the engine before 503")
    max_body_mb: float = Field(16.0, gt=0, description="request bodies above this get 413")
    max_images: int = Field(16, ge=0, description="vision models: images per request at most, every turn counted")
    max_image_mb: float = Field(20.0, gt=0, description="vision models: an image's size at most (413 above)")
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="vision models: an image's width x height at most, before the model resizes it"
    )
    max_request_image_pixels: int = Field(
        100_000_000, ge=1, description="vision models: a request's images' width x height together at most (400 above)"
    )
    image_pixel_budget: int = Field(
        200_000_000,
        ge=1,
        description="vision models: decoded image pixels the worker holds at once, every request together (about 3 "
        "bytes each); a request waits for room, 503 after 30 s",
    )
    allow_image_urls: bool = Field(False, description="vision models: fetch http(s) image URLs; off: data only")
    allowed_image_hosts: tuple[str, ...] = Field(
        (), description="hosts on loopback or private addresses that image URLs may be fetched from"
    )
    image_url_timeout: float = Field(10.0, gt=0, description="seconds an image URL's fetch may take")
    stored_responses: int = Field(
        2048, ge=0, description="Responses API: stored responses kept (oldest out first); 0: none kept"
    )
    stored_responses_mb: float = Field(64.0, gt=0, description="Responses API: the stored responses' size at most")
    trust_remote_code: bool = False
    rate_limit: int | str = Field(
        0, description="requests per client (key name, else address): per minute, or text like '120/minute'; 0: off"
    )
    tokens_per_minute: int = Field(0, ge=0, description="generated tokens per minute per client; 0: no limit")
    trusted_proxies: tuple[str, ...] = Field(
        (), description="proxy addresses/networks whose X-Forwarded-For names the client"
    )
    allowed_hosts: tuple[str, ...] = Field(
        (), description="Host names this server answers besides its bind address and localhost"
    )
    cors_origins: tuple[str, ...] = Field(
        (), description="web origins allowed to call the API from a browser; none by default"
    )
    max_connections: int = Field(256, ge=1, description="open connections at most; more get 503")
    health_requires_key: bool = Field(False, description="put /health behind the key check too")
    metrics_requires_key: bool = Field(False, description="put /metrics behind the key check too")
    enable_metrics: bool = False
    blas: str = Field(
        "auto", description="Linux: auto, mkl, blis, openblas, bundled or a path to a library exporting cblas_sgemm"
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="BLAS threads (and cores on Linux); default: an even share of the cores, one thread fewer",
    )
    continuous_batching: bool = Field(True, description="decode many requests together; false: one at a time")
    max_num_seqs: int = Field(16, ge=1, le=1024, description="requests decoded together at most (then they queue)")
    prefill_step_size: int = Field(512, ge=16, le=65536, description="prompt tokens prefilled in one step at most")
    use_paged_cache: bool = Field(
        True,
        description="the prefix cache holds KV in 32-token blocks in a prefix tree, a shared start held once; "
        "false: one copy of each whole sequence",
    )
    cache_memory_mb: int | None = Field(
        None, ge=0, description="prefix cache budget in MB (0: no cache); unset: cache_memory_percent"
    )
    cache_scope: Literal["key", "entry"] = Field(
        "key",
        description="key: each API key's prompts hit only its own prefix cache (and disk tier); entry: every key "
        "of the entry shares it, so a shared system prompt hits across keys and a key's cached_tokens can tell "
        "what another key sent",
    )
    cache_memory_percent: float = Field(
        0.20, gt=0, le=1, description="prefix cache budget as a fraction of physical memory"
    )
    max_kv_memory_mb: float | None = Field(
        None,
        gt=0,
        description="KV cache of running requests in MB at most (requests wait for room, or 400 when one never "
        "fits); unset: what the machine has left after the weights, the prefix cache and a margin",
    )
    cache_disk: CacheDiskConfig | None = Field(
        None,
        description="write the prefix cache's blocks to disk too, found again after a restart, a swap or a reboot "
        "(off by default)",
    )
    kv_bits: Literal[4, 8] | None = Field(
        None, description="the prefix cache holds KV quantized to this many bits (memory and disk); unset: as computed"
    )
    kv_group_size: Literal[32, 64, 128] = Field(64, description="kv_bits: values that share one scale and bias")
    reasoning_parser: str | None = Field(
        None, description="qwen3 or deepseek_r1: return reasoning apart from the answer"
    )
    strict_model_name: bool = Field(False, description="404 for a request naming another model; default: answer it")
    tool_call_parser: str = Field(
        "auto", description="the model's tool-call format: auto (from its chat template, else hermes) or a family"
    )
    enable_auto_tool_choice: bool = Field(
        True, description="read the model's own tool calls (tool_choice auto); false: only forced calls"
    )
    mcp: tuple[str, ...] = Field((), description="names from mcp_servers whose tools this model's worker offers")
    mcp_auto_execute: tuple[str, ...] = Field(
        (),
        description="tools the worker runs itself: SERVER__TOOL (shell patterns), or a server's name for all its tools",
    )
    mcp_max_tool_calls: int = Field(8, ge=0, le=1000, description="tool executions one request may make at most")
    mcp_config: str | None = Field(None, description="a Claude-Desktop-style mcpServers JSON file: all its servers")
    distributed: DistributedConfig | None = Field(
        None, description="split the model over several ranks (hosts), started and supervised as one unit"
    )
    speculative: SpeculativeConfig | None = Field(
        default_factory=SpeculativeConfig,
        description="draft tokens and verify them together in one forward pass: prompt lookup, adaptive, "
        "unless set (false: off)",
    )

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative_off(cls, v):
        # `speculative: false` (or off, or null) turns the default prompt lookup off.
        return None if v is False or v is None or (isinstance(v, str) and v.lower() == "off") else v

    @field_validator("model")
    @classmethod
    def _known_builtin_model(cls, v: str | None):
        # Refused here rather than at load: `vllmmlxctl check` and a reload see it before a worker starts.
        if v is not None and v.startswith(BUILTIN_PREFIX) and v[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            raise ValueError(f"unknown builtin model; the builtins are {known}")
        return v

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

    @model_validator(mode="before")
    @classmethod
    def _where_it_runs(cls, data: Any):
        # Said of the entry as a whole, unless a misspelt key ("modle") is there to be named instead.
        if isinstance(data, dict) and "model" not in data and set(data) <= set(cls.model_fields):
            raise ValueError(ONE_OF_THE_TWO)
        if isinstance(data, dict) and "upstream_api_key" in data:
            raise ValueError("upstream_api_key needs upstream")
        return data

    @field_validator(
        "trusted_proxies",
        "allowed_hosts",
        "cors_origins",
        "mcp",
        "mcp_auto_execute",
        "allowed_image_hosts",
        mode="before",
    )
    @classmethod
    def _many_is_a_list(cls, v):
        return (v,) if isinstance(v, str) else v

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

    @field_validator("distributed")
    @classmethod
    def _can_split(cls, v: DistributedConfig | None, info):
        model = info.data.get("model")
        if v is not None and isinstance(model, str):
            problem = distributed_problem(model, info.data.get("load", "eager"), v)
            if problem:
                raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _download_needs_a_repo(self):
        # Said at load: `download: true` on a builtin or a path would silently mean nothing.
        if self.download and hub_repo_id(self.model) is None:
            raise ValueError("download: true needs a Hugging Face repo id (org/name) as model")
        return self

    @model_validator(mode="after")
    def _lifecycle(self):
        if self.idle_unload_s is not None and self.load != "lazy":
            raise ValueError("idle_unload_s needs load: lazy (an eager model stays loaded)")
        return self

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
            raise ValueError(
                f"max_tokens ({self.max_tokens}), the default, is larger than max_request_tokens "
                f"({self.max_request_tokens}), the cap: lower max_tokens or leave it out"
            )
        return self


class UpstreamConfig(EntryConfig):
    """A model another host's daemon serves: the gateway routes to it; nothing runs here."""

    upstream: str = Field(description="the base URL of a model served by another host (http://host:port)")
    upstream_api_key: SecretStr | None = Field(None, description="the key sent to the upstream host (Bearer)")

    @model_validator(mode="before")
    @classmethod
    def _nothing_runs_here(cls, data: Any):
        # A key of a model served here (a port, an engine setting, load: lazy) says something this
        # entry cannot do: refused by name, rather than as an unknown key.
        if isinstance(data, dict):
            if "model" in data:
                raise ValueError(ONE_OF_THE_TWO)
            for key in data:
                if key in ModelConfig.model_fields and key not in cls.model_fields:
                    raise ValueError(
                        f"{key} is for a model served here; an upstream entry runs on its host "
                        "(set it in that host's config)"
                    )
        return data

    @field_validator("upstream")
    @classmethod
    def _upstream_url(cls, v: str):
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("upstream must be a base URL like http://studio-2.local:8001")
        return v.rstrip("/").removesuffix("/v1")

    SECRETS: ClassVar[tuple[str, ...]] = ("api_key", "upstream_api_key")

    @property
    def is_upstream(self) -> bool:
        return True


class ResolvedModel(ModelConfig):
    """A model served here with what the daemon resolved for it: what its worker receives."""

    key_grants: tuple[KeyGrant, ...] = ()  # INTERNAL_FIELDS: the api_keys section, resolved for this entry
    gateway_token: SecretStr | None = None  # INTERNAL_FIELDS: set with a gateway section (gateway_token())
    mcp_servers_resolved: dict[str, McpServerConfig] = Field(default_factory=dict)  # INTERNAL_FIELDS: mcp, resolved

    @model_validator(mode="after")
    def _mcp_file_alone(self):
        # `vllmmlxd serve --mcp-config FILE`: no config section resolves the servers, the entry does.
        # (In a config file, Config fills mcp_servers_resolved and this finds it already set.)
        if self.mcp_config and not self.mcp_servers_resolved:
            object.__setattr__(self, "mcp_servers_resolved", load_mcp_file(self.mcp_config))
        return self

    SECRETS: ClassVar[tuple[str, ...]] = ("api_key", "gateway_token")

    @property
    def grants(self) -> tuple[KeyGrant, ...]:
        return self.key_grants

    def to_worker_json(self) -> str:
        data = self.model_dump(mode="json")
        data["mcp_servers_resolved"] = {n: s.revealed() for n, s in self.mcp_servers_resolved.items()}
        return self._reveal(data)


class ResolvedUpstream(UpstreamConfig):
    """An upstream entry with its keys resolved: the gateway checks them before it sends anything on."""

    key_grants: tuple[KeyGrant, ...] = ()  # INTERNAL_FIELDS: the api_keys section, resolved for this entry

    @property
    def grants(self) -> tuple[KeyGrant, ...]:
        return self.key_grants


def entry_kind(value: Any) -> str:
    """Which kind an entry is: the key ``upstream`` says it runs elsewhere."""
    if isinstance(value, dict):
        return "[upstream]" if "upstream" in value else "[model]"
    return "[upstream]" if isinstance(value, UpstreamConfig) else "[model]"


Resolved = ResolvedModel | ResolvedUpstream
if TYPE_CHECKING:
    # What a valid config's `models:` holds, as its readers see it: Config's validators resolve every entry.
    Entry = Resolved
else:
    # What `models:` is read as. The tags appear in pydantic's error locations; config/load.py drops them.
    Entry = Annotated[
        Annotated[ModelConfig, Tag("[model]")] | Annotated[UpstreamConfig, Tag("[upstream]")],
        Discriminator(entry_kind),
    ]
ENTRY_KINDS: dict[str, type[EntryConfig]] = {"[model]": ModelConfig, "[upstream]": UpstreamConfig}


def resolve(entry: EntryConfig, **internal: Any) -> Resolved:
    """``entry`` as its resolved kind, with the fields the daemon computed (no second validation)."""
    cls = ResolvedUpstream if isinstance(entry, UpstreamConfig) else ResolvedModel
    current = {name: getattr(entry, name) for name in type(entry).model_fields}
    if isinstance(entry, (ResolvedModel, ResolvedUpstream)):
        current |= {name: getattr(entry, name) for name in INTERNAL_FIELDS if name in cls.model_fields}
    fields = {**current, **{k: v for k, v in internal.items() if k in cls.model_fields}}
    return cls.model_construct(_fields_set=set(entry.model_fields_set), **fields)
