"""Memory admission: whether a config's models fit in the machine, and how changed ones are replaced.

An entry's footprint is its weights + its prefix-cache budget + a worker's own overhead (+ twice
its running requests' KV budget when ``max_kv_memory_mb`` sets one, for the copy a batch makes as
rows join and leave: by default a worker takes what the machine has left, so nothing is counted);
the sum over entries must fit in physical memory less ``daemon.memory_reserve_mb``. A
changed entry's zero-downtime swap holds its old and new worker at once: where both do
not fit, it is stopped, then started. All in whole MiB ("MB", as in the config's keys).
Pure, but for :func:`load_memory_plan`, the shell that reads the machine and the model files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..config.cache import cache_budget  # what cache_memory_mb / cache_memory_percent budget, defined once
from ..config.distributed import DistributedConfig, model_shape, share_text
from ..config.names import BUILTIN_KINDS, BUILTIN_PREFIX
from ..config.schema import Config, ModelConfig
from ..runtime import memory as machine
from ..runtime.shard_families import layer_share
from ..store import weights

# A builtin:tiny worker on Linux (BLIS loaded, 12 MB of weights) measured 172 MiB RSS once
# ready and a 191 MiB peak (VmHWM) while loading: the interpreter, FastAPI, mlx and the BLAS.
WORKER_OVERHEAD_MB = 200
# As engine/step/kv_budget.py's PEAK_COPIES (the daemon never imports the engine; a test keeps them equal):
# mlx-lm copies a batch's KV when a row joins or leaves, so a worker's KV peaks at twice its budget.
KV_PEAK_COPIES = 2
FIX_HINT = (
    "lower cache_memory_mb or cache_memory_percent (and max_kv_memory_mb where set), remove a model, "
    "or lower daemon.memory_reserve_mb"
)


def mb(n: int) -> str:
    """``12,345 MB``."""
    return f"{n:,} MB"


@dataclass(frozen=True)
class Footprint:
    """What one worker is expected to hold, in MB, and where each number came from."""

    weights_mb: int
    cache_mb: int
    worker_mb: int = WORKER_OVERHEAD_MB
    weights_known: bool = True  # False: not downloaded (or unreadable); counted as 0
    weights_note: str = ""
    cache_note: str = ""
    kv_mb: int = 0  # KV_PEAK_COPIES x max_kv_memory_mb, when the entry sets it

    @property
    def total_mb(self) -> int:
        return self.weights_mb + self.cache_mb + self.worker_mb + self.kv_mb

    def render(self) -> str:
        """``5,024 MB = 13 MB weights (builtin:tiny: safetensors) + 4,811 MB cache (20% of physical) + 200 MB worker``."""
        weights = mb(self.weights_mb) if self.weights_known else "? MB"
        unknown = "" if self.weights_known else "; unknown, counted as 0"
        kv = f" + {mb(self.kv_mb)} running KV ({KV_PEAK_COPIES} x max_kv_memory_mb)" if self.kv_mb else ""
        return (
            f"{mb(self.total_mb)} = {weights} weights ({self.weights_note}{unknown}) + {mb(self.cache_mb)} cache "
            f"({self.cache_note}){kv} + {mb(self.worker_mb)} worker"
        )


@dataclass(frozen=True)
class Capacity:
    """Physical memory (None: unknown), the reserve kept free, and MLX's GPU working set where known."""

    physical_mb: int | None
    reserve_mb: int
    working_set_mb: int | None = None
    source: str = ""

    @property
    def usable_mb(self) -> int | None:
        if self.physical_mb is None:
            return None
        usable = max(self.physical_mb - self.reserve_mb, 0)
        return usable if self.working_set_mb is None else min(usable, self.working_set_mb)

    def render(self) -> str:
        """``21,332 MB usable (23,380 MB physical (MemTotal) - 2,048 MB reserve)``."""
        if self.physical_mb is None:
            return "physical memory unknown: not checked"
        parts = f"{mb(self.physical_mb)} physical ({self.source}) - {mb(self.reserve_mb)} reserve"
        if self.working_set_mb is not None:
            parts += f", at most MLX's {mb(self.working_set_mb)} working set"
        return f"{mb(self.usable_mb or 0)} usable ({parts})"


@dataclass(frozen=True)
class Change:
    """How a changed entry with a running worker is replaced, and the memory in use at once if it were swapped."""

    swap: bool  # False: stopped, then started (its old and new worker do not fit together)
    peak_mb: int

    def render(self, usable_mb: int | None) -> str:
        of = "" if usable_mb is None else f" of {mb(usable_mb)}"
        if self.swap:
            return f"swap (old and new worker at once: {mb(self.peak_mb)}{of})"
        return f"restart: not enough memory for both (old and new worker at once would need {mb(self.peak_mb)}{of})"


@dataclass(frozen=True)
class MemoryPlan:
    """Each entry's footprint against the machine's usable memory, and how each changed entry is replaced."""

    capacity: Capacity
    entries: Mapping[str, Footprint]
    changes: Mapping[str, Change] = field(default_factory=dict)
    lazy: frozenset[str] = frozenset()  # loaded on demand: only the largest must fit beside the eager ones
    remote: tuple[RemoteRank, ...] = ()  # distributed entries' ranks on other hosts

    @property
    def needed_mb(self) -> int:
        """The eager entries, plus the largest lazy one (the daemon unloads idle lazy models to load another)."""
        eager = sum(f.total_mb for n, f in self.entries.items() if n not in self.lazy)
        return eager + max((f.total_mb for n, f in self.entries.items() if n in self.lazy), default=0)

    @property
    def fits(self) -> bool:
        usable = self.capacity.usable_mb
        return (usable is None or self.needed_mb <= usable) and all(r.fits for r in self.remote)

    def swap(self, name: str) -> bool:
        """True when ``name`` may be replaced with no downtime (both workers fit at once)."""
        change = self.changes.get(name)
        return change is None or change.swap

    def render(self) -> str:
        """The plan for people: the verdict with the numbers, then one line per entry and per change."""
        usable = self.capacity.usable_mb
        verdict = "fits" if usable is None or self.needed_mb <= usable else "does not fit"
        lines = [f"memory: {mb(self.needed_mb)} needed, {self.capacity.render()}: {verdict}"]
        lines += [f"  {name}: {fp.render()}{self._lazy_note(name)}" for name, fp in self.entries.items()]
        lines += [f"  {r.render()}" for r in self.remote]
        if self.fits:  # a plan that does not fit is refused: how it would have swapped does not matter
            lines += [f"  {name}, changed: {c.render(self.capacity.usable_mb)}" for name, c in self.changes.items()]
        return "\n".join(lines)

    def _lazy_note(self, name: str) -> str:
        return " (lazy: only the largest lazy model is counted)" if name in self.lazy else ""

    def refusal(self) -> str:
        """Why the config is refused, naming each entry with its numbers, and what to change."""
        far = [r for r in self.remote if not r.fits]
        usable = self.capacity.usable_mb
        lines = []
        if usable is not None and self.needed_mb > usable:
            lines.append(f"not enough memory: the models need {mb(self.needed_mb)}, {self.capacity.render()}")
            ranked = sorted(self.entries.items(), key=lambda item: -item[1].total_mb)
            lines += [f"  {name}: {fp.render()}{self._lazy_note(name)}" for name, fp in ranked]
        lines += [f"not enough memory on {r.host}: {r.render()}" for r in far]
        hint = FIX_HINT + (", or split the model over more hosts" if far else "")
        return "\n".join([*lines, hint])

    def fields(self) -> dict[str, object]:
        """The numbers as log fields."""
        c = self.capacity
        return {
            "needed_mb": self.needed_mb,
            "usable_mb": c.usable_mb,
            "physical_mb": c.physical_mb,
            "reserve_mb": c.reserve_mb,
            "working_set_mb": c.working_set_mb,
        }


def model_kind(spec: str, task: str, config: Mapping | None) -> str:
    """What an entry's model serves, as its worker decides it (worker/main.py's load_engine):
    ``generate``, or ``embedding``, ``rerank``, ``speech``, which keep no prefix cache. ``config``:
    the model folder's config.json, when it is on disk."""
    if task == "rerank":
        return "rerank"
    if spec.startswith(BUILTIN_PREFIX):
        return BUILTIN_KINDS.get(spec[len(BUILTIN_PREFIX) :], "generate")
    config = config or {}
    kind = config.get("model_type")
    if kind == "whisper":
        return "speech"
    if kind == "bert":
        classifier = any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])
        return "rerank" if classifier else "embedding"
    return "generate"


def make_footprint(
    entry: ModelConfig, estimate: weights.WeightsEstimate, physical_mb: int | None, kind: str = "generate"
) -> Footprint:
    """One entry's footprint from its config and its weights' estimate; an entry whose model does
    not generate (``kind``) holds no prefix cache, whatever its cache budget says."""
    cache_mb, cache_note = cache_budget(entry, physical_mb) if kind == "generate" else (0, f"none: a {kind} model")
    weights_mb = -(-(estimate.nbytes or 0) // machine.MIB)  # rounded up
    return Footprint(
        weights_mb=weights_mb,
        cache_mb=cache_mb,
        weights_known=estimate.nbytes is not None,
        weights_note=f"{entry.model}: {estimate.source}",
        cache_note=cache_note,
        kv_mb=math.ceil(KV_PEAK_COPIES * (entry.max_kv_memory_mb or 0)),
    )


def rank_weights(
    total_mb: int, split: tuple[int, dict[int, int]] | None, dist: DistributedConfig, rank: int, layers: int | None
) -> int:
    """The MB of weights rank ``rank`` holds: what is outside the layers (every rank keeps it), plus its
    layers (pipeline) or its share of every layer (tensor). From the headers when they were read,
    scaled to ``total_mb`` (a 16-bit model runs in float32 on a CPU); else from the layer count."""
    if split is not None and split[1]:
        outside, per_layer = split
        raw = outside + sum(per_layer.values())
        layers = max(per_layer) + 1
        if dist.parallel == "pipeline":
            start, end = layer_share(layers, dist.world, rank)
            mine = outside + sum(per_layer.get(i, 0) for i in range(start, end))
        else:
            mine = outside + sum(per_layer.values()) // dist.world
        return -(-total_mb * mine // raw)
    if dist.parallel == "pipeline" and layers:
        start, end = layer_share(layers, dist.world, rank)
        return -(-total_mb * (end - start) // layers)
    return -(-total_mb // dist.world)


def rank_footprints(
    entry: ModelConfig, whole: Footprint, split: tuple[int, dict[int, int]] | None, layers: int | None
) -> list[Footprint]:
    """Each rank's footprint: its weights, the cache budget (the others hold their share of the same
    prefixes, no more than rank 0's), and a worker's overhead (the embedding model: rank 0's only)."""
    dist = entry.distributed
    assert dist is not None
    out = []
    for rank in range(dist.world):
        share = share_text(entry.model, dist, rank) or f"1/{dist.world}"
        out.append(
            Footprint(
                weights_mb=rank_weights(whole.weights_mb, split, dist, rank, layers),
                cache_mb=whole.cache_mb,
                weights_known=whole.weights_known,
                weights_note=f"rank {rank}, {share} of {whole.weights_note}",
                cache_note=whole.cache_note,
                kv_mb=whole.kv_mb,  # rank 0 admits by its share of the KV; the others hold about as much
            )
        )
    return out


def local_footprint(ranks: list[Footprint], entry: ModelConfig) -> Footprint:
    """What a distributed entry holds on this host: its local ranks together."""
    dist = entry.distributed
    assert dist is not None
    here = [fp for fp, host in zip(ranks, dist.hosts) if host.local]
    return Footprint(
        weights_mb=sum(f.weights_mb for f in here),
        cache_mb=sum(f.cache_mb for f in here),
        worker_mb=WORKER_OVERHEAD_MB * len(here),
        weights_known=all(f.weights_known for f in here),
        weights_note="; ".join(f.weights_note for f in here),
        cache_note=f"{here[0].cache_note}, {len(here)} ranks here" if len(here) > 1 else here[0].cache_note,
        kv_mb=sum(f.kv_mb for f in here),
    )


@dataclass(frozen=True)
class RemoteRank:
    """A rank of a distributed entry on another host, and the memory it may use there (None: not given)."""

    entry: str
    rank: int
    host: str
    footprint: Footprint
    memory_mb: int | None

    @property
    def fits(self) -> bool:
        return self.memory_mb is None or self.footprint.total_mb <= self.memory_mb

    def render(self) -> str:
        """``llama70 rank 1 on studio-2.local: 21,504 MB = ...; 16,384 MB given (memory_mb): does not fit``."""
        if self.memory_mb is None:
            room = "not checked: give the host's memory_mb"
        else:
            room = f"{mb(self.memory_mb)} given (memory_mb): {'fits' if self.fits else 'does not fit'}"
        return f"{self.entry} rank {self.rank} on {self.host}: {self.footprint.render()}; {room}"


def plan_memory(
    capacity: Capacity,
    entries: Mapping[str, Footprint],
    replacing: Mapping[str, Footprint] = {},
    lazy: frozenset[str] = frozenset(),
    remote: tuple[RemoteRank, ...] = (),
) -> MemoryPlan:
    """Check ``entries`` (the whole new set) against ``capacity``, and choose swap or restart for ``replacing``.

    ``replacing`` holds the running worker of each changed entry. Changes run together, so
    each swap's old worker takes from the room the others leave; entries are considered in
    order, and one whose old worker does not fit in what is left is stopped, then started.
    """
    plan = MemoryPlan(capacity, dict(entries), lazy=lazy, remote=remote)
    usable = capacity.usable_mb
    held = plan.needed_mb
    changes: dict[str, Change] = {}
    for name, old in replacing.items():
        peak = held + old.total_mb
        swap = usable is None or peak <= usable
        changes[name] = Change(swap, peak)
        if swap:
            held = peak
    return MemoryPlan(capacity, dict(entries), changes, lazy, remote)


def read_capacity(reserve_mb: int) -> Capacity:
    """This machine's memory, less ``reserve_mb``."""
    found = machine.read_machine_memory()
    physical_mb = None if found.physical is None else found.physical // machine.MIB
    working_set_mb = None if found.working_set is None else found.working_set // machine.MIB
    return Capacity(physical_mb, reserve_mb, working_set_mb, found.source)


def folder_config(folder: Path | None) -> dict | None:
    """A model folder's config.json, or None (no folder on disk yet, or none readable)."""
    if folder is None:
        return None
    try:
        found = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def entry_footprints(
    entries: Mapping[str, ModelConfig], state_dir: Path, physical_mb: int | None
) -> dict[str, Footprint]:
    """Each entry's footprint, reading each model's files once."""
    cpu = machine.cpu_backend()
    estimates: dict[tuple[str, str | None, str | None], weights.WeightsEstimate] = {}

    def footprint(entry: ModelConfig) -> Footprint:
        draft = entry.speculative.draft_model if entry.speculative is not None else None
        models = (entry.model or "", entry.embedding_model, draft)
        if models not in estimates:
            estimates[models] = weights.estimate_entry_weights(
                models[0], models[1], state_dir, cpu=cpu, draft_model=draft
            )
        folder = weights.model_folder(entry.model or "", state_dir)
        return make_footprint(
            entry, estimates[models], physical_mb, model_kind(entry.model or "", entry.task, folder_config(folder))
        )

    return {name: footprint(entry) for name, entry in entries.items()}


def distributed_footprints(
    entries: Mapping[str, ModelConfig], whole: Mapping[str, Footprint], state_dir: Path
) -> tuple[dict[str, Footprint], tuple[RemoteRank, ...]]:
    """Distributed entries: what each holds on this host (its local ranks), and its ranks elsewhere."""
    local: dict[str, Footprint] = {}
    remote: list[RemoteRank] = []
    for name, entry in entries.items():
        dist = entry.distributed
        if dist is None:
            continue
        folder = weights.model_folder(entry.model, state_dir)
        shape = model_shape(entry.model)
        ranks = rank_footprints(
            entry, whole[name], weights.layer_bytes(folder) if folder else None, shape.layers if shape else None
        )
        local[name] = local_footprint(ranks, entry)
        remote += [RemoteRank(name, r, h.host, ranks[r], h.memory_mb) for r, h in enumerate(dist.hosts) if not h.local]
    return local, tuple(remote)


def load_memory_plan(config: Config, state_dir: Path, replacing: Mapping[str, ModelConfig] = {}) -> MemoryPlan:
    """:func:`plan_memory` for ``config`` on this machine (models served here; upstreams use none)."""
    capacity = read_capacity(config.daemon.memory_reserve_mb)
    local = {name: entry for name, entry in config.models.items() if isinstance(entry, ModelConfig)}
    footprints = entry_footprints(
        {**local, **{f"\0{n}": e for n, e in replacing.items()}}, state_dir, capacity.physical_mb
    )
    here, remote = distributed_footprints(local, footprints, state_dir)
    return plan_memory(
        capacity,
        {name: here.get(name, footprints[name]) for name in local},
        {name: footprints[f"\0{name}"] for name in replacing if name not in here},
        frozenset(name for name, entry in local.items() if entry.load == "lazy"),
        remote,
    )
