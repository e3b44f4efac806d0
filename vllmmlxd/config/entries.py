"""Model entries, one kind per way a model is served, and what the daemon resolves into them.

A user writes an entry of one of two kinds, told apart by the key that says where the model
runs: ``model:`` (served here, ``ModelConfig``) or ``upstream:`` (served by another host's
daemon, ``UpstreamConfig``). Both share ``EntryConfig``: the names clients use, who may call it,
how long a request may take. Lifecycle (``load``, ``idle_unload_s``) and everything about an
engine, a port or a worker belong to the kind served here; an upstream entry that carries such a
key is refused, naming it. Frozen pydantic, unknown keys forbidden, option names as the
reference server's flags in snake_case.

An entry is one flat mapping, and ``ModelConfig`` is composed of one model per concern
(``CONCERNS``: loading, serving, limits, vision, cache...; each in the module of its name), so
its keys stay flat attributes (``entry.max_queue``) and an error's place is the key as written.

What the daemon computes (the api_keys section's grants, the MCP servers an entry uses, the
gateway's token) is not on these schemas: ``ResolvedModel`` and ``ResolvedUpstream`` carry it,
built by ``Config`` from the sections beside the models. ``ResolvedModel`` is the contract
between the daemon and a worker: sent as JSON on the worker's stdin, or built from flags by
``vllmmlxd serve``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Discriminator, Field, SecretStr, Tag, ValidationInfo, field_validator, model_validator

from .base import Strict
from .cache import CacheConfig
from .compute import ComputeConfig
from .distributed import DistributedConfig, distributed_problem
from .fields import ModelSpec, Names
from .generation import GenerationConfig
from .keys import DIGEST_PREFIX, SHA256_RE, KeyGrant, key_digest
from .limits import LimitsConfig
from .loading import DEFAULT_LOAD, LoadingConfig
from .mcp import McpEntryConfig, McpServerConfig, load_mcp_file
from .parsing import ParsingConfig
from .responses import ResponsesConfig
from .serving import ServingConfig, TelemetryConfig
from .speculative import Speculation, SpeculativeConfig
from .speech import SpeechConfig
from .tracing import TracingConfig
from .vision import VisionConfig


class EntryConfig(Strict):
    """What every model entry has, wherever it runs: its names, who may call it, a request's time."""

    served_model_name: str | None = Field(None, description="the name clients see (default: the entry's key)")
    aliases: Names = Field((), description="more names clients may give for this model")
    owned_by: str = Field("vllmmlxd", description="owned_by in /v1/models")
    api_key: SecretStr | None = None
    api_keys: Names | None = Field(
        None,
        description="names from the api_keys section allowed here ('*': every key whose models match); unset: open",
    )
    timeout: float = Field(300.0, gt=0, description="seconds before a request is ended")
    group: str | None = Field(
        None,
        description="a replica set: entries with the same group are answered by the gateway under its name too",
    )
    embedding_model: ModelSpec | None = Field(
        None,
        description="an embedding model preloaded beside the model, served on /v1/embeddings: "
        "builtin:all-minilm-l6-v2 or a local BERT sentence-transformers folder",
    )

    @field_validator("api_key")
    @classmethod
    def _keep_the_digest(cls, v: SecretStr | None) -> SecretStr | None:
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

    def _reveal(self, data: dict[str, Any]) -> str:
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


# One flat mapping in the YAML, read by one model per concern (CONCERNS). pydantic takes the fields
# of the last base first: the bases are listed last concern first, so the model's spec is read
# before `distributed` (whose check reads it) and `--help` lists the flags in the concerns' order.
class ModelConfig(
    McpEntryConfig,
    ParsingConfig,
    CacheConfig,
    ComputeConfig,
    ResponsesConfig,
    SpeechConfig,
    VisionConfig,
    LimitsConfig,
    GenerationConfig,
    TelemetryConfig,
    ServingConfig,
    LoadingConfig,
    EntryConfig,
):
    """A model served here: what to load, when, where to listen and how to serve it."""

    distributed: DistributedConfig | None = Field(
        None, description="split the model over several ranks (hosts), started and supervised as one unit"
    )
    speculative: Speculation = Field(
        default_factory=SpeculativeConfig,
        description="draft tokens and verify them together in one forward pass: prompt lookup, adaptive, "
        "unless set (false: off)",
    )

    @model_validator(mode="before")
    @classmethod
    def _where_it_runs(cls, data: Any) -> Any:
        # Said of the entry as a whole, unless a misspelt key ("modle") is there to be named instead.
        if isinstance(data, dict) and "model" not in data and set(data) <= set(cls.model_fields):
            raise ValueError(ONE_OF_THE_TWO)
        if isinstance(data, dict) and "upstream_api_key" in data:
            raise ValueError("upstream_api_key needs upstream")
        return data

    @field_validator("distributed")
    @classmethod
    def _can_split(cls, v: DistributedConfig | None, info: ValidationInfo) -> DistributedConfig | None:
        model = info.data.get("model")
        if v is not None and isinstance(model, str):
            problem = distributed_problem(model, info.data.get("load", DEFAULT_LOAD), v)
            if problem:
                raise ValueError(problem)
        return v


# The concerns a model entry served here is made of, as `vllmmlxd serve --help` groups their flags.
CONCERNS: dict[str, type[Strict]] = {
    "names and access": EntryConfig,
    "loading": LoadingConfig,
    "serving": ServingConfig,
    "telemetry": TelemetryConfig,
    "generation defaults": GenerationConfig,
    "limits": LimitsConfig,
    "images (vision models)": VisionConfig,
    "audio (speech models)": SpeechConfig,
    "stored responses (Responses API)": ResponsesConfig,
    "compute": ComputeConfig,
    "prefix cache and KV": CacheConfig,
    "output parsing": ParsingConfig,
    "MCP tools": McpEntryConfig,
}


class UpstreamConfig(EntryConfig):
    """A model another host's daemon serves: the gateway routes to it; nothing runs here."""

    upstream: str = Field(description="the base URL of a model served by another host (http://host:port)")
    upstream_api_key: SecretStr | None = Field(None, description="the key sent to the upstream host (Bearer)")

    @model_validator(mode="before")
    @classmethod
    def _nothing_runs_here(cls, data: Any) -> Any:
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
    def _upstream_url(cls, v: str) -> str:
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

    key_grants: tuple[KeyGrant, ...] = ()  # the api_keys section, resolved for this entry
    gateway_token: SecretStr | None = None  # set with a gateway section (schema.gateway_token())
    mcp_servers_resolved: dict[str, McpServerConfig] = Field(default_factory=dict)  # mcp and mcp_config, resolved
    telemetry: TracingConfig | None = None  # the telemetry section (daemon-wide): traces

    @model_validator(mode="before")
    @classmethod
    def _mcp_file_alone(cls, data: Any) -> Any:
        # `vllmmlxd serve --mcp-config FILE`: no config section resolves the servers, the entry does
        # (in a config file, Config fills mcp_servers_resolved and this finds it given).
        if isinstance(data, dict) and not data.get("mcp_servers_resolved"):
            path = data.get("mcp_config")
            if isinstance(path, (str, Path)) and path:
                return {**data, "mcp_servers_resolved": load_mcp_file(path)}
        return data

    SECRETS: ClassVar[tuple[str, ...]] = ("api_key", "gateway_token")

    @property
    def grants(self) -> tuple[KeyGrant, ...]:
        return self.key_grants

    def to_worker_json(self) -> str:
        data = self.model_dump(mode="json")
        data["mcp_servers_resolved"] = {n: s.revealed() for n, s in self.mcp_servers_resolved.items()}
        if self.telemetry is not None:
            data["telemetry"]["headers"] = {k: v.get_secret_value() for k, v in self.telemetry.headers.items()}
        return self._reveal(data)


class ResolvedUpstream(UpstreamConfig):
    """An upstream entry with its keys resolved: the gateway checks them before it sends anything on."""

    key_grants: tuple[KeyGrant, ...] = ()  # the api_keys section, resolved for this entry
    telemetry: TracingConfig | None = None  # the telemetry section: the gateway traces what it sends on

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

# Fields vllmmlxd fills itself (from the sections beside the models): never written by hand.
INTERNAL_FIELDS = frozenset(
    (ResolvedModel.model_fields.keys() - ModelConfig.model_fields.keys())
    | (ResolvedUpstream.model_fields.keys() - UpstreamConfig.model_fields.keys())
)


def resolve(entry: EntryConfig, **internal: Any) -> Resolved:
    """``entry`` as its resolved kind, with the fields the daemon computed (no second validation)."""
    cls = ResolvedUpstream if isinstance(entry, UpstreamConfig) else ResolvedModel
    current = {name: getattr(entry, name) for name in type(entry).model_fields}
    if isinstance(entry, (ResolvedModel, ResolvedUpstream)):
        current |= {name: getattr(entry, name) for name in INTERNAL_FIELDS if name in cls.model_fields}
    fields = {**current, **{k: v for k, v in internal.items() if k in cls.model_fields}}
    return cls.model_construct(_fields_set=set(entry.model_fields_set), **fields)
