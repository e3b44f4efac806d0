"""How one engine schedules: built once from the model entry, read by the scheduler. No mlx."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config.schema import ModelConfig
from ..paths import kv_cache_dir

Method = Literal["prompt-lookup", "draft", "mtp"]


@dataclass(frozen=True)
class SpeculationOptions:
    """An entry's ``speculative:`` settings."""

    method: Method = "prompt-lookup"
    num_draft: int = 4  # tokens drafted a step at most
    ngram: int = 6  # prompt lookup matches the last this-many tokens (down to 2)
    adaptive: bool = True  # the width from costs and acceptance, rows pausing; False: always the widest


@dataclass(frozen=True)
class EngineOptions:
    continuous_batching: bool = True
    max_num_seqs: int = 16  # decoded together at most (1 when not batching)
    max_queue: int = 64  # admitted but not yet running; past that, 503
    prefill_step_size: int = 512  # prompt tokens per sequence per step at most
    cache_budget_bytes: int = 0  # the prefix cache's hard budget; 0: no cache
    paged_cache: bool = True  # the prefix cache in blocks (block_cache.py); False: whole sequences
    cache_disk_dir: Path | None = None  # the prefix cache's disk tier; None: off
    cache_disk_budget_bytes: int = 0
    kv_bits: int | None = None  # the prefix cache holds KV quantized to this many bits
    kv_group_size: int = 64
    reasoning_parser: str | None = None  # qwen3, deepseek_r1: reasoning apart from the answer
    tool_call_parser: str = "auto"  # the tool-call family; auto: from the chat template, else hermes
    speculative: SpeculationOptions | None = None  # draft and verify inside the batch; None: off
    kv_budget_bytes: int | None = None  # running requests' KV (max_kv_memory_mb); None: the engine's default
    kv_budget_source: str = ""
    memory_bytes: int = 0  # the machine's memory (a cgroup's limit where lower), for the default; 0: unknown
    memory_source: str = ""

    @property
    def max_running(self) -> int:
        return self.max_num_seqs if self.continuous_batching else 1


def engine_options(
    config: ModelConfig, physical_memory_bytes: int, memory_source: str = "", state_dir: Path | None = None
) -> EngineOptions:
    """The options of the entry ``config``; the cache budget in MB wins over the percent of memory.
    ``state_dir`` holds the disk tier's default directory."""
    if config.cache_memory_mb is not None:
        budget = config.cache_memory_mb * 1024 * 1024
    else:
        budget = int(config.cache_memory_percent * physical_memory_bytes)
    kv, kv_source = explicit_limit(config.max_kv_memory_mb) if config.max_kv_memory_mb is not None else (None, "")
    disk = config.cache_disk
    disk_dir = None
    if disk is not None:
        disk_dir = Path(disk.dir).expanduser() if disk.dir else kv_cache_dir(state_dir) if state_dir else None
    return EngineOptions(
        continuous_batching=config.continuous_batching,
        max_num_seqs=config.max_num_seqs,
        max_queue=config.max_queue,
        prefill_step_size=config.prefill_step_size,
        cache_budget_bytes=budget,
        paged_cache=config.use_paged_cache,
        cache_disk_dir=disk_dir,
        cache_disk_budget_bytes=int(disk.budget_gb * 1024**3) if disk is not None else 0,
        kv_bits=config.kv_bits,
        kv_group_size=config.kv_group_size,
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
        speculative=speculation_of(config),
        kv_budget_bytes=kv,
        kv_budget_source=kv_source,
        memory_bytes=physical_memory_bytes,
        memory_source=memory_source,
    )


def speculation_of(config: ModelConfig) -> SpeculationOptions | None:
    spec = config.speculative
    if spec is None:
        return None
    return SpeculationOptions(method=spec.method, num_draft=spec.num_draft, ngram=spec.ngram, adaptive=spec.adaptive)


def explicit_limit(mb_value: float) -> tuple[int, str]:
    """``max_kv_memory_mb`` in bytes, and its source."""
    return int(mb_value * 1024 * 1024), f"max_kv_memory_mb {mb_value:g}"
