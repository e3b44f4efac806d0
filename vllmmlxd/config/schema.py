"""The configuration schema: frozen pydantic models, unknown keys forbidden.

``ModelConfig`` is also the contract between the daemon and a worker: the daemon
sends a worker its entry as JSON, and ``vllmmlxd serve`` builds one from flags.
Option names mirror the reference server's flags in snake_case.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

BLAS_NAMES = ("auto", "mkl", "blis", "openblas", "bundled")
REASONING_PARSERS = ("qwen3", "deepseek_r1")  # as vllmmlxd/parsers/reasoning has them (a test keeps them equal)
TOOL_PARSERS = (  # as vllmmlxd/parsers/tools has them (a test keeps them equal)
    "auto", "deepseek", "functionary", "glm47", "granite", "hermes", "kimi", "llama", "mistral", "nemotron", "qwen", "xlam",
)
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """One model entry: what to load, where to listen and how to serve it."""

    model: str = Field(description="builtin:NAME, a .gguf path, a local MLX folder or a Hugging Face repo id")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    served_model_name: str | None = None
    aliases: tuple[str, ...] = ()
    owned_by: str = "vllmmlxd"
    api_key: SecretStr | None = None
    timeout: float = Field(300.0, gt=0)
    max_tokens: int = Field(32768, ge=1)
    max_request_tokens: int = Field(32768, ge=1)
    default_temperature: float | None = Field(None, ge=0, le=2)
    default_top_p: float | None = Field(None, gt=0, le=1)
    stream_interval: int = Field(1, ge=1)
    max_queue: int = Field(64, ge=1, description="requests waiting for the engine before 503")
    max_body_mb: float = Field(16.0, gt=0, description="request bodies above this get 413")
    trust_remote_code: bool = False
    rate_limit: int = Field(0, ge=0, description="requests per minute per client (API key, else address); 0: off")
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
    # Features of later versions: a value other than the default is refused, never ignored.
    mcp_config: str | None = None
    embedding_model: str | None = None

    @field_validator("blas")
    @classmethod
    def _blas_choice(cls, v: str):
        # A path need not exist here: a missing library falls back to the bundled BLAS with a warning.
        if v not in BLAS_NAMES and "/" not in v and not v.endswith((".so", ".dylib")) and ".so." not in v:
            raise ValueError(f"blas must be one of {', '.join(BLAS_NAMES)} or a path to a shared library, not {v!r}")
        return v

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, v):
        if v is not None and v not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, not {v!r}")
        return v

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, v):
        if v not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_PARSERS)}, not {v!r}")
        return v

    @field_validator("mcp_config", "embedding_model")
    @classmethod
    def _not_yet(cls, v, info):
        if v:
            raise ValueError(f"{info.field_name} is not available in this version of vllmmlxd")
        return v

    @field_validator("aliases", mode="before")
    @classmethod
    def _one_alias_is_a_list(cls, v):
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _request_cap_covers_default(self):
        if self.max_tokens > self.max_request_tokens:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) is larger than max_request_tokens ({self.max_request_tokens})"
            )
        return self

    def to_worker_json(self) -> str:
        """This entry as JSON with secrets revealed: only ever sent down a worker's stdin pipe."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = self.api_key.get_secret_value()
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
    models: dict[str, ModelConfig] = Field(default_factory=dict)

    @field_validator("models")
    @classmethod
    def _names_and_ports(cls, models: dict[str, ModelConfig]):
        seen: dict[tuple[str, int], str] = {}
        for name, entry in models.items():
            if not MODEL_NAME_RE.match(name):
                raise ValueError(f"model name {name!r} must be letters, digits, '_', '.' or '-'")
            addr = (entry.host, entry.port)
            if addr in seen:
                raise ValueError(f"models {seen[addr]!r} and {name!r} both listen on {entry.host}:{entry.port}")
            seen[addr] = name
        return models
