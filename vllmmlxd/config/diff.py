"""What a reload changes: a pure comparison of two configs.

The supervisor starts the added entries, stops the removed ones, leaves the rest alone,
and for a changed entry either pushes the new settings to its running worker (every
changed key is live: read per request) or swaps in a new worker (some key is read only
when a worker starts: the model, its engine, its process or its socket).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, SecretStr

from vllmmlxd.config.gateway import GatewayConfig
from vllmmlxd.config.schema import Config, ModelConfig
from vllmmlxd.config.speech import SPEECH_FIELDS
from vllmmlxd.config.vision import IMAGE_FIELDS

# Daemon keys read once at start-up: the socket is bound and the state dir opened then.
RESTART_REQUIRED_FIELDS = frozenset({"state_dir", "control_socket"})

# Model keys a running worker takes in place: each is read per request (or, for max_queue and
# max_kv_memory_mb, at admission), so a request started before the change finishes under the old values.
# Every other key (the model, its engine, threads, BLAS, cache budget, host/port, parsers)
# is read once at a worker's start and needs a new worker; a key added to the schema
# later is a new-worker key until it is listed here.
LIVE_FIELDS = frozenset(
    {
        "api_key",
        "rate_limit",
        "timeout",
        "default_temperature",
        "default_top_p",
        "max_tokens",
        "max_request_tokens",
        "max_queue",
        "max_kv_memory_mb",
        "stream_interval",
        "served_model_name",
        "aliases",
        "owned_by",
        "enable_metrics",
        "strict_model_name",
        "enable_auto_tool_choice",
        "max_body_mb",
        *IMAGE_FIELDS,
        *SPEECH_FIELDS,
        "stored_responses",
        "stored_responses_mb",
        "hosted_tools",  # read per request
        "fim",  # read per request
        "cache_scope",  # read per request: the salt of its prefix-cache entries
        "api_keys",
        "key_grants",
        "tokens_per_minute",
        "trusted_proxies",
        "allowed_hosts",
        "cors_origins",
        "health_requires_key",
        "metrics_requires_key",
        "gateway_token",
        "telemetry",  # the worker swaps its span exporter
        # MCP: the worker reconnects its MCP clients in place; the model stays loaded.
        "mcp",
        "mcp_auto_execute",
        "mcp_max_tool_calls",
        "mcp_config",
        "mcp_servers_resolved",
        # Read by the daemon (when to load and unload) and the gateway (where an upstream is), not by a worker.
        "load",
        "idle_unload_s",
        "download",
        "upstream",
        "upstream_api_key",
        "group",
    }
)

APPLY_LIVE = "apply live"
NEW_WORKER = "new worker"


@dataclass(frozen=True)
class EntryChange:
    """How one changed entry is applied: ``kind`` is APPLY_LIVE or NEW_WORKER; ``forcing`` the
    changed keys that need a new worker (empty when live)."""

    keys: tuple[str, ...]
    forcing: tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        return not self.forcing

    @property
    def kind(self) -> str:
        return APPLY_LIVE if self.live else NEW_WORKER

    def describe(self) -> str:
        """``apply live (timeout)`` or ``new worker (port; also timeout)``."""
        if self.live:
            return f"{APPLY_LIVE} ({', '.join(self.keys)})"
        rest = [k for k in self.keys if k not in self.forcing]
        also = f"; also {', '.join(rest)}" if rest else ""
        return f"{NEW_WORKER} ({', '.join(self.forcing)}{also})"

    def as_dict(self) -> dict:
        """The wire form the control API carries per entry."""
        return {"kind": self.kind, "keys": list(self.keys), "forcing": list(self.forcing)}


def classify(keys: tuple[str, ...]) -> EntryChange:
    """The change made of these changed keys: live unless one of them is not a live key."""
    return EntryChange(keys=tuple(keys), forcing=tuple(k for k in keys if k not in LIVE_FIELDS))


def needs_new_worker(old: ModelConfig, new: ModelConfig) -> tuple[bool, list[str]]:
    """Whether going from ``old`` to ``new`` needs a new worker, and the changed keys that force it."""
    change = classify(changed_fields(old, new))
    return (not change.live, list(change.forcing))


@dataclass(frozen=True)
class ReloadPlan:
    """Model entries added, removed, changed (with the changed fields) and unchanged, plus the daemon section."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()
    daemon_changed: tuple[str, ...] = ()
    restart_required: tuple[str, ...] = ()  # daemon fields that changed but apply only after a restart
    gateway_changed: tuple[str, ...] = ()  # gateway fields that changed ("added" / "removed": the whole section)
    # Per changed entry: applied live to its worker, or a new worker (and the keys forcing it).
    changes: dict[str, EntryChange] = field(default_factory=dict)

    @property
    def live(self) -> tuple[str, ...]:
        """Changed entries whose running worker takes the new settings in place."""
        return tuple(n for n in self.changed if self.change(n).live)

    @property
    def new_worker(self) -> tuple[str, ...]:
        """Changed entries that need a new worker (swapped in, or stopped then started)."""
        return tuple(n for n in self.changed if not self.change(n).live)

    def change(self, name: str) -> EntryChange:
        """The classified change of entry ``name`` (classified from ``changed`` when not given)."""
        return self.changes.get(name) or classify(self.changed[name])

    def entries(self) -> list[dict]:
        """Per entry, for the control API: ``{name, kind, keys, forcing}``; kind is one of
        ``added``, ``removed``, ``unchanged``, ``apply live``, ``new worker``."""
        rows = [{"name": n, "kind": "added", "keys": [], "forcing": []} for n in self.added]
        rows += [{"name": n, **self.change(n).as_dict()} for n in self.changed]
        rows += [{"name": n, "kind": "removed", "keys": [], "forcing": []} for n in self.removed]
        rows += [{"name": n, "kind": "unchanged", "keys": [], "forcing": []} for n in self.unchanged]
        return rows

    @property
    def is_empty(self) -> bool:
        """True when the reload would change nothing."""
        return not (self.added or self.removed or self.changed or self.daemon_changed or self.gateway_changed)

    def render(self, details: bool = True) -> str:
        """Lines for people: ``added: x``, ``changed: y (port, timeout)``, ``removed: z``, ``unchanged: a, b``.

        ``details``: under ``changed``, one line per entry saying how it applies (``  y: new worker
        (port; also timeout)``); off when the per-entry ``entries()`` travel beside the text.
        """
        lines = []
        if self.is_empty:
            lines.append("no changes")
        if self.added:
            lines.append(f"added: {', '.join(self.added)}")
        if self.changed:
            lines.append("changed: " + ", ".join(f"{n} ({', '.join(fs)})" for n, fs in self.changed.items()))
            lines += [f"  {n}: {self.change(n).describe()}" for n in self.changed] if details else []
        if self.removed:
            lines.append(f"removed: {', '.join(self.removed)}")
        if self.unchanged:
            lines.append(f"unchanged: {', '.join(self.unchanged)}")
        if self.daemon_changed:
            lines.append(f"daemon changed: {', '.join(self.daemon_changed)}")
        if self.restart_required:
            lines.append(f"restart required: {', '.join(self.restart_required)}")
        if self.gateway_changed:
            lines.append(f"gateway: {', '.join(self.gateway_changed)}")
        return "\n".join(lines)


def diff_models(old: Config | None, new: Config) -> ReloadPlan:
    """Compare ``old`` (None on first load: everything is added) with ``new``."""
    if old is None:
        return ReloadPlan(added=tuple(sorted(new.models)))
    changed = {}
    unchanged = []
    for name in sorted(old.models.keys() & new.models.keys()):
        fields = changed_fields(old.models[name], new.models[name])
        if fields:
            changed[name] = fields
        else:
            unchanged.append(name)
    daemon_changed = changed_fields(old.daemon, new.daemon)
    return ReloadPlan(
        gateway_changed=_gateway_change(old.gateway, new.gateway),
        added=tuple(sorted(new.models.keys() - old.models.keys())),
        removed=tuple(sorted(old.models.keys() - new.models.keys())),
        changed=changed,
        changes={name: classify(fields) for name, fields in changed.items()},
        unchanged=tuple(unchanged),
        daemon_changed=daemon_changed,
        restart_required=tuple(f for f in daemon_changed if f in RESTART_REQUIRED_FIELDS),
    )


def _gateway_change(old: GatewayConfig | None, new: GatewayConfig | None) -> tuple[str, ...]:
    if old is None or new is None:
        return () if old is new else (("added",) if old is None else ("removed",))
    return changed_fields(old, new)


_ABSENT = object()


def changed_fields(old: BaseModel, new: BaseModel) -> tuple[str, ...]:
    """Sorted names of the fields whose values differ; between two kinds of entry (served here, upstream),
    a field only one of them has is changed too."""
    names = set(type(old).model_fields) | set(type(new).model_fields)
    return tuple(sorted(f for f in names if not _same(getattr(old, f, _ABSENT), getattr(new, f, _ABSENT))))


def _same(a: object, b: object) -> bool:
    # Compare what a secret holds, not its masked '**********' form.
    if isinstance(a, SecretStr) and isinstance(b, SecretStr):
        return a.get_secret_value() == b.get_secret_value()
    return a == b
